"""CPU work inside a graph on the GPU runs on the CPU, as eager runs it (kiln/lower/host_work.py).

A program on CUDA inputs that makes tensors without a device (`torch.full((4,), 0.5)`, `torch.rand(())`) computes
them on the CPU in eager, and its random draws take the CPU's generator. The lowering tests compile such programs
for the GPU on fake CUDA tensors (tests/support/fake_cuda.py: nothing runs); the tests marked `cuda` run them on a
GPU beside eager, numbers and generator states.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.lower import ir
from support.fake_cuda import compile_inference

aten = torch.ops.aten
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class CpuDrawsBesideCudaOps(torch.nn.Module):
    """The fuzzer's pattern: an unused CPU draw, a CPU Bernoulli mask copied to the GPU, a 0-d CPU draw mixed
    into a GPU op as a scalar."""

    def forward(self, x):
        torch.empty(2, 3).t().uniform_(-3, 100)
        mask = torch.bernoulli(torch.full((4,), 0.5))
        scale = torch.rand(())
        return x * 2 + scale, x + mask.to(x.device)


def _externs(graph: ir.LoweredGraph) -> dict:
    return {node.name: node for node in graph.nodes if isinstance(node, ir.Extern)}


def test_cpu_values_in_a_cuda_graph_are_aten_calls_on_the_cpu():
    graph = compile_inference(CpuDrawsBesideCudaOps(), [torch.randn(4)]).artefacts["ir"]
    externs = _externs(graph)
    ops = [str(e.op) for e in externs.values()]
    for op in ("aten.empty.memory_format", "aten.full.default", "aten.bernoulli.default", "aten.rand.default"):
        assert op in ops, f"{op} is not run through ATen:\n{graph}"
    on_cpu = [e for e in externs.values() if e.kwargs.get("device") == torch.device("cpu")]
    assert len(on_cpu) == 3, graph  # empty, full and rand make their tensors on the CPU, as eager's calls do


def test_a_gpu_kernel_reads_cpu_values_only_through_copies_to_the_gpu():
    """The mask crosses by the program's own `.to(x.device)`, the 0-d draw by a copy the lowering adds; no
    kernel loads a buffer that an op on the CPU made."""
    graph = compile_inference(CpuDrawsBesideCudaOps(), [torch.randn(4)]).artefacts["ir"]
    externs = _externs(graph)
    copies = [e for e in externs.values() if e.op is aten._to_copy.default]
    assert [e.kwargs["device"].type for e in copies] == ["cuda", "cuda"], graph
    host = {name for name, e in externs.items() if e.op is not aten._to_copy.default}
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer):
            read = {load.buf for load in ir.loads(node.data.body)}
            assert not read & host, f"{node.name} reads CPU buffers {read & host}:\n{graph}"


class CpuInputAndOutputs(torch.nn.Module):
    """A graph taking a CPU tensor with dims beside a CUDA one, writing it, and returning CPU tensors."""

    def forward(self, x, y):
        y.add_(1)
        z = torch.randn(3, 3) @ y.t()
        return x * 3 + z.sum().to(x.device), z, torch.zeros(3)


def test_cpu_inputs_and_outputs_of_a_cuda_graph_compile_with_their_work_on_the_cpu():
    """No fallback of the whole graph to ATen: the CPU work (the write of the input, the draw, the matmul, the
    zeros) are ATen calls on the CPU, the GPU work a kernel that reads the CPU sum through a copy."""
    compiled = compile_inference(CpuInputAndOutputs(), [torch.randn(4), torch.randn(2, 3)], cpu_inputs=(1,))
    graph = compiled.artefacts["ir"]
    externs = _externs(graph)
    assert {str(e.op) for e in externs.values()} >= {"aten.add.Tensor", "aten.randn.default", "aten.mm.default",
                                                      "aten.sum.dim_IntList", "aten._to_copy.default",
                                                      "aten.full.default"}, graph
    assert compiled.num_kernels == 1, graph
    copies = [e for e in externs.values() if e.op is aten._to_copy.default]
    (kernel,) = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer)]
    assert {load.buf for load in ir.loads(kernel.data.body)} == {"arg0", copies[0].name}, graph


def test_a_cpu_graph_has_no_host_work():
    """On the CPU every value is on the host, and the C++ target computes it: nothing is forced to ATen."""
    from kiln.lower.host_work import host_work
    from support.lowering import trace

    gm = trace(lambda x: x * 2 + torch.full((4,), 0.5), torch.randn(4))
    assert host_work(gm) == frozenset()


def _with_cpu_draws(x):
    torch.empty(2, 3).t().random_(-3, 100)
    mask = torch.bernoulli(torch.full((4,), 0.5))
    scale = torch.rand(())
    return x * 2 + scale, x + mask.to(x.device), scale


def _assert_same(got, want) -> None:
    """CPU values bit for bit (eager's own ATen calls computed them); GPU values within float32 rounding (a
    kernel may fuse `x * 2 + s` into one multiply-add)."""
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.device == w.device, (k, g.device, w.device)
        if g.device.type == "cpu":
            assert torch.equal(g, w), (k, g, w)
        else:
            torch.testing.assert_close(g, w, msg=lambda m, k=k: f"output {k}: {m}")


@cuda
def test_cpu_draws_in_a_cuda_graph_take_the_cpu_generator_as_in_eager():
    """Values, the 0-d CPU output, and both generators' states after the call, as in eager."""
    x = torch.randn(4, device="cuda")
    compiled = kiln.compile(_with_cpu_draws)
    compiled(x)  # compiled before the generators are compared
    results = []
    for f in (_with_cpu_draws, compiled):
        torch.manual_seed(0)
        out = f(x)
        results.append((out, torch.get_rng_state(), torch.cuda.get_rng_state()))
    (want, want_cpu, want_cuda), (got, got_cpu, got_cuda) = results
    assert got[2].device.type == "cpu"
    _assert_same(got, want)
    assert torch.equal(got_cpu, want_cpu), "the CPU generator is not where eager left it"
    assert torch.equal(got_cuda, want_cuda), "the GPU generator moved"


def _with_cpu_tensors(x, y):
    y.add_(1)
    z = torch.randn(3, 3) @ y.t()
    return x * 3 + z.sum().to(x.device), z, torch.zeros(3)


@cuda
def test_cpu_inputs_and_outputs_of_a_cuda_graph_as_in_eager():
    """Values, devices, the write into the CPU input and the CPU generator's state, as in eager."""
    x = torch.randn(4, device="cuda")
    compiled = kiln.compile(_with_cpu_tensors)
    compiled(x, torch.randn(2, 3))  # compiled before the generator is compared
    results = []
    for f in (_with_cpu_tensors, compiled):
        y = torch.arange(6.0).reshape(2, 3)
        torch.manual_seed(0)
        out = f(x, y)
        results.append((out, y, torch.get_rng_state()))
    (want, want_y, want_state), (got, got_y, got_state) = results
    assert [t.device.type for t in got] == ["cuda", "cpu", "cpu"]
    _assert_same(got, want)
    assert torch.equal(got_y, want_y), "the write into the CPU input"
    assert torch.equal(got_state, want_state), "the CPU generator is not where eager left it"

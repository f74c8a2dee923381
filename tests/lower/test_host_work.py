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


@cuda
def test_cpu_draws_in_a_cuda_graph_take_the_cpu_generator_as_in_eager():
    """Values, the 0-d CPU output, and both generators' states after the call, bit for bit with eager."""
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
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g, w)
    assert torch.equal(got_cpu, want_cpu), "the CPU generator is not where eager left it"
    assert torch.equal(got_cuda, want_cuda), "the GPU generator moved"

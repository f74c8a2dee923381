"""0-d CPU tensors mixed into CUDA graphs (kiln/runtime/host_scalars.py, kiln/lower/host_work.py), as eager allows
them.

Where the lowering reads them is tested on fake CUDA tensors; the compiled graphs run on a GPU (the tests marked
`cuda`)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import kiln
from kiln.lower import ir
from support.fake_cuda import compile_inference

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def scaled(x, scale):
    return x / scale, scale * 2


class Scaled(nn.Module):
    def forward(self, x, scale):
        return scaled(x, scale)


def test_a_kernel_reads_a_cpu_scalar_input_through_a_copy_and_the_host_computes_its_cpu_output():
    """`x / scale` is a kernel reading a GPU copy of the input; `scale * 2`, a CPU tensor in eager, is an ATen
    call on the host input, returned where it was made."""
    graph = compile_inference(Scaled(), [torch.randn(4), torch.tensor(2.0)], cpu_inputs=(1,)).artefacts["ir"]
    externs = {n.name: n for n in graph.nodes if isinstance(n, ir.Extern)}
    (copy,) = [e for e in externs.values() if e.op is torch.ops.aten._to_copy.default]
    (doubled,) = [e for e in externs.values() if e.op is torch.ops.aten.mul.Tensor]
    assert copy.args[0].buf == doubled.args[0].buf == "arg1", graph
    (kernel,) = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer)]
    assert {load.buf for load in ir.loads(kernel.data.body)} == {"arg0", copy.name}, graph


class ScaledAttentionScores(nn.Module):
    """DeBERTa's pattern: a 0-d CPU scale made without a device divides CUDA scores, and the backward of
    the division saves it."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)

    def forward(self, x):
        scale = torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * 2)
        scores = self.q(x) @ x.transpose(-1, -2) / scale.to(dtype=x.dtype)
        return scores.softmax(-1).sum(), scale


@cuda
def test_a_cpu_scale_in_a_cuda_training_graph_compiles_and_trains_as_eager():
    torch.manual_seed(0)
    model = ScaledAttentionScores().cuda()
    reference = ScaledAttentionScores().cuda()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    x = torch.randn(2, 8, 16, device="cuda")
    loss, scale = compiled(x)
    want_loss, want_scale = reference(x)
    assert scale.device.type == "cpu" and scale.item() == pytest.approx(math.sqrt(32))
    torch.testing.assert_close(loss, want_loss)
    loss.backward()
    want_loss.backward()
    torch.testing.assert_close(model.q.weight.grad, reference.q.weight.grad)


@cuda
def test_a_cpu_scalar_input_of_a_cuda_graph_is_read_as_eager_reads_it():
    x = torch.randn(8, device="cuda")
    compiled = kiln.compile(scaled)
    for value in (2.0, 3.0):  # a new value, no recompile needed: it is data
        got = compiled(x, torch.tensor(value))
        want = scaled(x, torch.tensor(value))
        torch.testing.assert_close(got[0], want[0])
        assert got[1].device.type == "cpu" and got[1].item() == want[1].item()

"""0-d CPU tensors mixed into CUDA graphs (kiln/runtime/host_scalars.py), as eager allows them.

Which inputs and outputs cross to the GPU and back is decided from the graph (runs anywhere); the
compiled graphs run on a GPU (the tests marked `cuda`)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import kiln
from kiln.runtime.host_scalars import HostScalarCall, host_scalar_inputs, host_scalar_outputs, on_device
from support.lowering import trace

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def scaled(x, scale):
    return x / scale, scale * 2


def test_the_host_scalars_of_a_graph_are_its_0d_cpu_inputs_and_the_outputs_the_caller_sees():
    gm = trace(scaled, torch.randn(4), torch.tensor(2.0))
    assert host_scalar_inputs(gm) == (1,) and host_scalar_outputs(gm) == (1,)
    gm.meta["kiln.aot"] = {"kind": "forward", "visible_outputs": 1}  # output 1 is saved for the backward
    assert host_scalar_outputs(gm) == ()
    assert on_device(scaled, gm, "cpu") is scaled  # the C++ target reads host memory itself
    assert isinstance(on_device(scaled, gm, "cuda:0"), HostScalarCall)


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

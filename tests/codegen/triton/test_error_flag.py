"""Index checks of Triton kernels: one error flag per graph on the GPU, asserted once; a check per launch on the CPU.

A kernel that gathers by index (an embedding, `x[idx]`) checks each index and stores an error code into the
`kiln_error` flag where one is out of range. On the GPU, eager's own check is a device-side assert, reported at a
later synchronization, so the graph's checking kernels share one flag, asserted once before the wrapper returns:
allocating and asserting a flag per kernel cost T5's forward 15 allocations and 30 kernels a step. Under the
interpreter (CPU tensors) eager raises at the op, so the flag is read after each launch.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

import kiln  # noqa: E402
from support.fake_cuda import compile_inference  # noqa: E402
from support.triton_device import DEVICE  # noqa: E402
from support.triton_sm90 import recording_builds  # noqa: E402


class TwoLookups(nn.Module):
    """Two gathers of computed rows with a matmul between them: two checking kernels the extern keeps apart."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x, rows, again):
        h = self.first(x)[rows] * 2.0
        return self.second(h)[again] * 3.0


INPUTS = [torch.randn(10, 16), torch.randint(0, 10, (6,)), torch.randint(0, 6, (4,))]


def _lines(wrapper: str, text: str) -> list[int]:
    return [i for i, line in enumerate(wrapper.splitlines()) if text in line]


def _launches_with_the_flag(wrapper: str) -> list[int]:
    return [i for i, line in enumerate(wrapper.splitlines())
            if "kiln_error" in line and "torch.zeros" not in line and "_check_error_flag" not in line]


def test_the_graphs_checking_kernels_share_one_flag_asserted_before_the_return_on_the_gpu():
    with recording_builds():
        graph = compile_inference(TwoLookups(), INPUTS)
    wrapper = graph.artefacts["wrapper.py"]
    launches = _launches_with_the_flag(wrapper)
    assert len(launches) == 2, wrapper
    (made,) = _lines(wrapper, "kiln_error = torch.zeros")
    (checked,) = _lines(wrapper, "_check_error_flag(kiln_error)")
    assert made < min(launches) and checked > max(launches), wrapper
    assert "return" in wrapper.splitlines()[checked + 1], wrapper


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's check; on the GPU eager's is a device-side assert")
def test_an_index_out_of_range_raises_at_its_op_under_the_interpreter():
    model = TwoLookups()
    compiled = kiln.compile(model, options={"cpu_backend": "triton"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(*INPUTS), model(*INPUTS))
        x, rows, again = INPUTS
        with pytest.raises(IndexError) as eager:
            model(x, rows, again + 6)
        with pytest.raises(IndexError) as got:
            compiled(x, rows, again + 6)
    assert str(got.value) == str(eager.value)

"""What a training graph saves for its backward, against torch.compile's partitioner on the same program.

Each pattern of a bf16-autocast transformer (tests/support/training_patterns.py) runs one training step through
kiln (its inductor, on the CPU) and through torch.compile's partition (tests/support/saved_tensors.py): kiln's
forward must save no more bytes than Inductor's, recompute what Inductor recomputes where that is what saves the
bytes (a norm's normalized input, from the input and the per-row statistics), and give eager's gradients.
"""
import copy

import pytest
import torch
import torch.nn as nn

from support.saved_tensors import kiln_saved, torch_saved
from support.training_patterns import PATTERNS, D, NormBlock, RMSNorm

BF16 = torch.bfloat16


def inputs():
    torch.manual_seed(0)
    return [torch.randn(4, 32, D)]


def mask_dtype_difference(reference) -> int:
    """What dropout masks cost kiln more than Inductor by their dtype alone: kiln draws eager's random stream,
    and eager's CPU dropout draws its mask with `bernoulli` in the input's dtype (bf16, two bytes), where
    Inductor's decomposition draws a bool mask of its own (one byte). The same masks are saved."""
    return sum((BF16.itemsize - 1) * torch.Size(shape).numel() for dtype, shape in reference.tensors
               if dtype is torch.bool)


@pytest.mark.parametrize("name", PATTERNS)
def test_saves_no_more_than_torch_compile_and_trains_like_eager(name):
    torch.manual_seed(0)
    model = PATTERNS[name]()
    eager = copy.deepcopy(model)
    reference = torch_saved(copy.deepcopy(model), inputs(), BF16)
    torch.manual_seed(1)  # dropout draws the same masks in both runs
    saved, split = kiln_saved(model, inputs(), BF16)
    assert saved.bytes <= reference.bytes + mask_dtype_difference(reference), \
        f"kiln {saved.tensors}\ntorch.compile {reference.tensors}\n{split.summary()}"
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=BF16):
        loss = eager(*inputs())
    loss.backward()
    for (what, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=1e-4, msg=what)


@pytest.mark.parametrize("norm", [lambda: nn.LayerNorm(D), lambda: RMSNorm(D)], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "bf16"])
def test_a_norm_saves_its_input_and_row_statistics_not_its_normalized_input(norm, stream):
    # The normalized input x_hat = (x - mean) * rstd is float32 and as wide as the input: the backward
    # recomputes it from the input (a bf16 linear's output, or the float32 stream, recomputed from the
    # block's input and that output) and the per-row statistics the forward saves.
    saved, split = kiln_saved(NormBlock(norm(), stream), inputs(), BF16)
    rows = (4, 32, D)
    assert saved.count(torch.float32, rows) == (1 if stream else 0), split.summary()  # the batch x itself
    assert saved.count(torch.float32, (4, 32, 1)) >= 1, split.summary()

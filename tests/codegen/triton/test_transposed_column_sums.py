"""A column sum whose rows are gathered from tensors of different layouts, stored beside the sum, on the Triton
target: values against float64 under the interpreter, kernels compiled for sm_90, and the sum read and written in
tiles of columns.

The backward of attention's fused q, k, v projection (Swin's window attention, a ViT's, a GPT's qkv linear) gets
q's and v's gradients as [windows, heads, tokens, head dim] and k's transposed (the scores' matmul gives it as
[windows, heads, head dim, tokens]). One kernel stores the three as the [tokens, 3 * heads * head dim] matrix
the weight's gradient multiplies, and sums its rows for the bias' gradient. Two of the three loads and the store
walk memory along the columns; only k's walks along the rows. That one load made the kernel a row reduction:
one program per column, every store strided by the width (1.2 ms a call for Swin-T's first stage on an H100,
where the traffic allows tens of microseconds).
"""
from __future__ import annotations

import re

import pytest
import torch

from support.triton_device import skip_module_unless_kernels_run

skip_module_unless_kernels_run()

from codegen.triton.test_norm_weight_gradients import compiled_and_checked  # noqa: E402
from codegen.triton.test_reduction_tiles import wide  # noqa: E402

WINDOWS, HEADS, TOKENS, HEAD_DIM = 6, 3, 49, 32  # 294 rows of 288 columns


def qkv_projection_gradients(grad_q, grad_k_transposed, grad_v):
    """The input rows of the qkv linear's gradient (tokens x [q | k | v] by head) and the bias' gradient, q's
    gradient scaled by the attention's 1/sqrt(head dim), as the training step's partition computes them."""
    grad_k = grad_k_transposed.transpose(-1, -2)
    stacked = torch.stack([wide(grad_q) * HEAD_DIM ** -0.5, wide(grad_k), wide(grad_v)])
    rows = stacked.permute(1, 3, 0, 2, 4).reshape(WINDOWS * TOKENS, 3 * HEADS * HEAD_DIM)
    return rows.to(grad_q.dtype), rows.sum(0)


def column_sum_launcher(source: str, columns: int) -> str:
    """The launcher of the (first pass of the) reduction over `columns` outputs."""
    kernels = source.split("@triton.jit")
    (name,) = [re.search(r"def (\w+)\(", k).group(1) for k in kernels[1:]
               if re.search(rf"over outer \({columns}\)", k) and "(combine" not in k]
    (line,) = [line for line in source.splitlines() if f"Launcher({name}," in line]
    return line


# CI runs the first dtype (KILN_MATRIX_SWEEP=1: both): the kernels' shape is the same in either, and the
# interpreter's seconds go to the reduction, not the casts (bf16 casts run in the other Triton tests)
@pytest.mark.sampled(every=2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_transposing_concatenation_and_its_column_sum_run_in_column_tiles(dtype):
    grad_q, grad_v = (torch.randn(WINDOWS, HEADS, TOKENS, HEAD_DIM).to(dtype) for _ in range(2))
    grad_k_transposed = torch.randn(WINDOWS, HEADS, HEAD_DIM, TOKENS).to(dtype)
    source = compiled_and_checked(qkv_projection_gradients, grad_q, grad_k_transposed, grad_v)
    launcher = column_sum_launcher(source, 288)
    assert int(re.search(r"XBLOCK=(\d+)", launcher).group(1)) >= 32, launcher

"""Shape padding's decision, shared by the lowering and the Triton target (kiln/codegen/triton/templates.py).

On CUDA, a compute-bound matmul whose K or N is not a multiple of what tensor cores want runs with its
operands zero-padded on those dims and its result sliced back to N columns (torch's `pad_mm` pass, whose
rules these follow). The slice keeps the padded row stride: `mm(a_p, b_p)[:, :n]` has rows `n_p` apart.
torch.compile returns that view as it is (its graph's output strides are recorded after `pad_mm`), and so
does kiln: the lowering gives such a matmul's result the padded strides (`padded_result_strides`), so its
readers index the rows where they are and a graph output is not copied to eager's contiguous strides (GPT-2's
logits, `[tokens, 50257]` with rows 50260 apart in float32 under TF32, 50264 in bf16).
"""
from __future__ import annotations

import torch

# Flops per element moved above which a matmul is limited by tensor-core throughput, not memory (a
# Hopper GPU's bf16 flops per byte of memory traffic sit well above it): below it, padding's copies cost
# more than the aligned kernel saves (benchmarks/padded_strides.py).
PAD_MIN_INTENSITY = 128


def padding_multiple(dtype: torch.dtype, device_type: str) -> int:
    """What tensor cores want the inner dims to be a multiple of (0: no padding), as torch's pad_mm decides."""
    if device_type != "cuda":
        return 0
    if dtype in (torch.float16, torch.bfloat16):
        return 8
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return 4
    return 0


def needs_padding(k: int, n: int, multiple: int) -> bool:
    return multiple > 0 and (k % multiple != 0 or n % multiple != 0)


def worth_padding(m: int, n: int, k: int) -> bool:
    """Whether an M x N x K matmul is compute-bound enough for shape padding to pay for its copies
    (a language model's LM head is; a small CNN's narrow classifier over a long K is not)."""
    return m * n * k >= PAD_MIN_INTENSITY * (m * k + k * n + m * n)


def pads(m: int, k: int, n: int, dtype: torch.dtype, device_type: str) -> int:
    """The multiple an M x K @ K x N matmul of `dtype` is padded to, or 0 when it runs unpadded."""
    multiple = padding_multiple(dtype, device_type)
    return multiple if needs_padding(k, n, multiple) and worth_padding(m, n, k) else 0


def padded_result_strides(size: tuple, multiple: int) -> tuple | None:
    """The strides of a padded matmul's result (`[batch,] M, N`, static sizes): contiguous over N padded to
    `multiple` (`padded_matmul`'s slice); None when N needs no padding (the result is contiguous)."""
    n = int(size[-1])
    if n % multiple == 0:
        return None
    wide = n + (-n % multiple)
    if len(size) == 2:
        return (wide, 1)
    return (int(size[-2]) * wide, wide, 1)

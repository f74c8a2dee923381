"""exp, sigmoid, tanh, the divisions and a product's sum in kiln's GPU kernels give eager's CUDA bits.

Eager's CUDA kernels compute `exp` with CUDA's expf and divide with IEEE division. Triton's own `tl.exp`,
`tl.sigmoid` and `/` are approximations some ulps away (benchmarks/results/triton_math): within any float32
tolerance, but a bf16 or fp16 result rounds the other way now and then, and a value's bits seen through
`.view(torch.int16)` differ. The kernels call libdevice's expf and correctly rounded
division instead, without fused multiply-adds (`enable_fp_fusion` off: eager rounds a product before adding);
a division by a host scalar is CUDA's product with the scalar's reciprocal. Under the
interpreter the kernels run numpy's math, not CUDA's, so this runs on the GPU only.
"""
from __future__ import annotations

import pytest
import torch

from support.triton_device import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's math bit for bit needs the GPU")

import kiln  # noqa: E402

OPS = {
    "exp": lambda x, y: x.exp(),
    "sigmoid": lambda x, y: x.sigmoid(),
    "tanh": lambda x, y: x.tanh(),
    "div": lambda x, y: x / y,
    "reciprocal": lambda x, y: y.reciprocal(),
    "floor_divide": lambda x, y: torch.div(x, y, rounding_mode="floor"),
    "trunc_divide": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    # a product then a sum: two roundings in eager, where Triton would fuse them into one multiply-add
    "multiply_add": lambda x, y: x * 1.5 + 0.5,
    "product_plus_tensor": lambda x, y: x * y + y,
    # by a host scalar, CUDA multiplies by its reciprocal (kiln/lower/scalar_operands.py; fuzz seed 510114)
    "divide_by_a_number": lambda x, y: x / 0.3,
    "divide_by_a_cpu_tensor": lambda x, y: x / torch.tensor(3.0, dtype=torch.float64),
    "divide_by_a_size": lambda x, y: x / (y.shape[0] * 0.7),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_kernels_compute_as_eager_s_cuda_kernels(op, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 1024, generator=g) * 4).to(dtype).cuda()
    y = (torch.randn(64, 1024, generator=g) * 3 + 0.1).to(dtype).cuda()
    fn = OPS[op]
    got, expected = kiln.compile(fn)(x, y), fn(x, y)
    same = (got == expected) | (got.isnan() & expected.isnan())
    assert bool(same.all()), f"{op} in {dtype}: {int((~same).sum())} of {same.numel()} differ, e.g. " \
                             f"{got[~same][:3].tolist()} vs eager's {expected[~same][:3].tolist()}"

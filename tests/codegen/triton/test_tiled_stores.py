"""A transposing kernel's stores are coalesced on the GPU, at any size of the dim they walk.

A tiled kernel (kiln/codegen/triton/heuristics.py `transposed_dim`) reads along one dim and writes along
another, Triton swapping the tile through shared memory. Triton lays each access out with a warp's threads
along the axis it can prove contiguous; a store whose dim is merged with others into `xindex` at a size that is
not a power of two (`xindex % 49`) proves none, and Triton breaks the tie towards axis 0. So the tile puts the
stores' dims on axis 0. These tests compile the kernels for sm_90 (without a GPU, tests/support/triton_sm90.py)
and read the layout Triton chose for the store from its TTGIR: a warp's threads must run along the stores' dims.
"""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

from support.lowering import assert_same, compile_for_triton  # noqa: E402
from support.triton_sm90 import ttgir_for_sm90  # noqa: E402


def store_threads(ttgir: str) -> list[int]:
    """threadsPerWarp of the layout of the (one) tl.store of a kernel's TTGIR."""
    (store,) = re.findall(r"tt\.store .*?: tensor<[^,]*, (#\w+)>", ttgir)
    layout = re.search(rf"^{store} = #ttg\.blocked<\{{(.*?)\}}>", ttgir, re.M).group(1)
    return [int(t) for t in re.search(r"threadsPerWarp = \[(\d+), (\d+)\]", layout).groups()]


def transposed_key(k):
    """Attention's K^T written for a bmm, heads folded into the batch: [batch * heads, dim, tokens]."""
    return k.permute(0, 2, 3, 1).reshape(-1, k.shape[3], k.shape[1]).contiguous() * 2


# (tokens, heads, dim): windows of 49 tokens (Swin), an odd length, a power of two
SHAPES = [(49, 3, 32), (37, 2, 24), (64, 2, 32)]


@pytest.mark.parametrize("tokens, heads, dim", SHAPES, ids=[f"tokens{s[0]}" for s in SHAPES])
def test_a_transposing_kernel_stores_along_its_rows(tokens, heads, dim):
    k = torch.randn(2, tokens, heads, dim)
    compiled, inputs, builds = compile_for_triton(transposed_key, k)
    (build,) = builds
    assert "tiled kernel" in build["source"], build["source"]
    stores_axis = 0 if "tl.arange(0, XBLOCK)[:, None]" in build["source"] else 1  # xindex: the stores' dims
    threads = store_threads(ttgir_for_sm90(build))
    assert threads[stores_axis] == 32 and threads[1 - stores_axis] == 1, (threads, build["source"])
    with torch.no_grad():
        assert_same(compiled(*inputs), transposed_key(*inputs))  # eager on the device the kernel ran on

"""The C++ build: kernels equal up to names compiled once (aliases), big sources built as parallel units."""
from __future__ import annotations

import torch

from kiln.runtime import cache
from support.lowering import check


def _twice(a, w):
    x = (a * 2).exp()
    y = x @ w          # an extern between two kernels that differ only in the buffers they touch
    return (y * 2).exp()


def test_equal_kernels_compile_once(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    a, w = torch.randn(4, 6), torch.randn(6, 6)
    compiled = check(_twice, a, w)
    src = compiled.artefacts["kernels.cpp"]
    assert compiled.num_kernels == 2
    assert src.count("__attribute__((alias(") == 1, src


def test_parallel_units_build_one_library(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_BUILD_JOBS", "2")
    monkeypatch.setattr(cache, "MIN_UNIT_BYTES", 0)
    units = cache.stats["units"]
    a = torch.randn(5, 7)
    check(lambda a: (a.sin().sum(-1), (a.t() @ a).cos(), a.amax(0) + 1), a)
    assert cache.stats["units"] - units >= 2
    assert cache.split_units("pre" + cache.UNIT_MARK + "a" + cache.UNIT_MARK + "b", 1) == \
        ["pre" + cache.UNIT_MARK + "a" + cache.UNIT_MARK + "b"]
    assert cache.split_units("pre" + cache.UNIT_MARK + "a" + cache.UNIT_MARK + "b", 2) == ["prea", "preb"]


def test_each_op_rounds_as_in_eager_with_no_fused_multiply_add():
    """`a*3 - b*3` with a == b is exactly 0 in eager, which rounds each product; a fused multiply-add would
    round once and leave the first product's rounding error."""
    a = torch.randn(1000)
    compiled = check(lambda a, b: a * 3 - b * 3, a, a.clone())
    assert compiled(a, a.clone())[0].abs().max().item() == 0.0

"""Memory planning: buffers die at last use and their storage is reused."""
from __future__ import annotations

import torch

from support.lowering import check


def test_freed_storage_is_reused():
    w = torch.randn(32, 32)
    x = torch.randn(8, 32)

    def fn(x, w):
        for _ in range(4):
            x = (x @ w).relu() * 0.5
        return x

    c = check(fn, x, w)
    wrapper = c.artefacts["wrapper.py"]
    assert "# reuse" in wrapper, wrapper
    assert "del " in wrapper


def test_outputs_have_eager_strides():
    x = torch.randn(4, 6)
    c = check(lambda x: (x.t() * 2, x.t().contiguous() + 1), x)
    a, b = c(x)
    assert a.stride() == (x.t() * 2).stride() and b.stride() == (x.t().contiguous() + 1).stride()


def test_outputs_are_never_reused():
    w = torch.randn(16, 16)
    x = torch.randn(4, 16)

    def fn(x, w):
        a = (x @ w).sin()
        b = (a @ w).cos()
        c = (b @ w).tanh()
        return a, c

    c = check(fn, x, w)
    a, out_c = c(x, w)
    torch.testing.assert_close(a, (x @ w).sin())

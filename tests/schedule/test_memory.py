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


def _line_of(wrapper: str, text: str) -> int:
    return next(k for k, line in enumerate(wrapper.splitlines()) if text in line)


def test_inputs_are_dropped_after_their_last_use():
    """The wrapper takes its inputs as one list and empties it, then drops each input after its last reader (a
    backward's saved activations die where eager's nodes would free them); an input it returns is kept, and
    the caller's list is empty after the call."""
    a, b, c = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)

    def fn(a, b, c):
        first = (a @ b).relu()
        return (first @ c).sin(), c

    compiled = check(fn, a, b, c)
    wrapper = compiled.artefacts["wrapper.py"]
    assert "args.clear()" in wrapper, wrapper
    dropped = [line.strip() for line in wrapper.splitlines() if line.strip().startswith("del ")]
    assert any("arg0" in line and "arg1" in line for line in dropped), wrapper
    assert not any("arg2" in line for line in dropped), wrapper  # returned
    args = [a, b, c]
    compiled.boxed_call(args)
    assert args == []


def test_unread_input_is_dropped_first():
    x, unused = torch.randn(4, 4), torch.randn(4, 4)
    wrapper = check(lambda x, unused: x.sin(), x, unused).artefacts["wrapper.py"]
    assert _line_of(wrapper, "del arg1") < _line_of(wrapper, "kernel"), wrapper


def _cast_then_other_work(a, w, big):
    """A bf16 gradient-like matmul result cast to float32 and returned, then a large unrelated product."""
    g = (a.t() @ a).float()
    h = (big @ w).relu()
    return g, h.sum(0)


def test_returned_cast_moves_past_a_peak_it_would_raise():
    """Cast right away, the float32 output (twice the bf16 result it frees) would be held across the large
    product: it runs after it, where the peak of live bytes is lower (kiln/schedule/order.py)."""
    bf16 = torch.bfloat16
    a, w, big = torch.randn(64, 96, dtype=bf16), torch.randn(96, 96, dtype=bf16), torch.randn(2048, 96, dtype=bf16)
    wrapper = check(_cast_then_other_work, a, w, big).artefacts["wrapper.py"]
    assert _line_of(wrapper, "kernel_cast") > _line_of(wrapper, "torch.mm(arg2"), wrapper


def test_returned_cast_stays_where_later_is_no_better():
    """When the work after it makes a large output from a small input, the peak is at the end, where a late
    cast would hold the bf16 result and its float32 copy beside that output: it stays where it is computed."""
    bf16 = torch.bfloat16
    a, x = torch.randn(64, 96, dtype=bf16), torch.randn(4, 96, dtype=bf16)

    def fn(a, x):
        return (a.t() @ a).float(), (x * 2).repeat(256, 1)

    wrapper = check(fn, a, x).artefacts["wrapper.py"]
    # the kernels by what they read: the cast reads the product, the other kernel `x` (the product's name
    # depends on the buffer count; `x` is the second input; a kernel's name lists its ops, a bf16 mul's a cast)
    cast = next(k for k, line in enumerate(wrapper.splitlines()) if line.lstrip().startswith("kernel_cast")
                and "arg1" not in line)
    assert cast < _line_of(wrapper, "(arg1.data_ptr()"), wrapper


def test_returned_casts_gather_into_one_kernel_where_the_peak_allows():
    """Three float32 casts of bf16 products (a backward's weight gradients) and a large product after them,
    where the peak is: the casts move past it, as late as the peak allows, and run as one kernel there."""
    bf16 = torch.bfloat16
    a, b, c = (torch.randn(64, 96, dtype=bf16) for _ in range(3))
    w, big = torch.randn(96, 96, dtype=bf16), torch.randn(2048, 96, dtype=bf16)

    def fn(a, b, c, w, big):
        grads = [(x.t() @ x).float() for x in (a, b, c)]
        return (*grads, (big @ w).relu().sum(0))

    compiled = check(fn, a, b, c, w, big)
    casts = [line for line in compiled.artefacts["wrapper.py"].splitlines() if "cast" in line and "(" in line
             and "data_ptr" in line]
    assert len(casts) == 1, compiled.artefacts["wrapper.py"]

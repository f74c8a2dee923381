"""Inputs on one written storage that differ in requires_grad or dtype (issue 21/28; aliased_inputs.py).

`f(a, b)` called with `b = a.detach()[:2]`, or `b = a.view(torch.int32)`: eager's write through `b` is no autograd
op, and `a` reads the written bytes after it. The graph is compiled with one base input per storage: the members
that require grad are views of it (their gradients go through it), the others views of its detached alias, a
member of another dtype its bytes reinterpreted (`view(dtype)`). Each case runs eagerly and compiled on identically
built arguments (`differential.check`: values, inputs after the call, aliasing, leaves' gradients), in grad mode
and under no_grad; a non-leaf's gradient is compared where it lands, on its root.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.differential import check

BACKENDS = ["aot_eager", "inductor"]
NO_ONE_BASE = "graph: inputs on one written storage that no one base can hold run op by op (aliased_inputs.py)"


def write_the_second_read_the_first(a, b):
    b[0].zero_()
    return a * 2, b + 1


def write_the_first_under_no_grad(a, b):
    with torch.no_grad():
        a[1:3].mul_(3)
    return a * 2, b + 1


def write_both(a, b):
    b[1:].add_(1)
    with torch.no_grad():
        a[:1].mul_(2)
    return a.sin(), b * 1


def saved_then_written(a, b):
    """`a * a` saves `a`; the write through `b` then makes eager's backward raise."""
    out = a * a
    b.zero_()
    return out, b + 1


PROGRAMS = [write_the_second_read_the_first, write_the_first_under_no_grad, write_both]


def _floats(dtype=torch.float32):
    return torch.linspace(0.5, 2.0, 8, dtype=dtype)


# (a, b) on one storage: a leaf or a non-leaf that requires grad, and a detached alias of (a part of) it
DETACHED = {
    "leaf, detached prefix": lambda: (lambda a: (a, a.detach()[:3]))(_floats().requires_grad_()),
    # the leaf views the storage's first 5 elements, the other alias (requiring no grad) its last 5
    "leaf view, overlapping alias": lambda: (lambda x: (x[:5].requires_grad_(), x[3:]))(_floats(torch.float64)),
    "non-leaf, detached all": lambda: (lambda y: (y, y.detach()))(_floats().requires_grad_() * 1),
    "non-leaf view, detached disjoint": lambda: (lambda y: (y[:4], y.detach()[4:]))(_floats().requires_grad_() * 1),
    "bf16 leaf, detached": lambda: (lambda a: (a, a.detach()[1:]))(_floats(torch.bfloat16).requires_grad_()),
}


@pytest.mark.sampled(every=4, classes=("program", "inputs"))
@pytest.mark.parametrize("grad_mode", [True, False], ids=["training", "no_grad"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inputs", list(DETACHED))
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_a_detached_alias_written_or_read(program, inputs, backend, grad_mode):
    check(program, lambda call: DETACHED[inputs](), backend, calls=2, grad_mode=grad_mode)


# (a, b): one storage as two dtypes; `a` requires grad (the base is its dtype) or not (the base is the narrower one)
REINTERPRETED = {
    "float32 and int32, one place": lambda: (lambda a: (a, a.view(torch.int32)))(_floats().requires_grad_()),
    "float16 and bfloat16, overlapping": lambda: (lambda x: (x[2:].requires_grad_(), x[:6].view(torch.bfloat16)))(
        _floats(torch.float16)),
    "float32 and narrower int16, disjoint": lambda: (lambda y: (y[:4], y.detach()[4:].view(torch.int16)))(
        _floats().requires_grad_() * 1),
    "float16 and wider int32": lambda: (lambda x: (x.requires_grad_(), x.detach()[2:6].view(torch.int32)))(
        _floats(torch.float16)),
    "int16 and wider float32, no grad": lambda: (lambda x: (x.view(torch.int16)[::2], x[1:7:2]))(_floats()),
    # a wider member whose elements are not runs of the base's along its last dim: one more dim, then selected
    "float32 and strided complex64": lambda: (lambda a: (a, a.detach().view(torch.complex64)[::2]))(
        _floats().requires_grad_()),
    "float64 and strided int32, no grad": lambda: (lambda x: (x[1:], x.view(torch.int32)[1::3]))(
        _floats(torch.float64)),
}


def add_through_the_bits(a, b):
    b[1:3].add_(1)
    return a * 2, b * 1


def scale_then_read_the_bits(a, b):
    with torch.no_grad():
        a[:2].mul_(2)
    return a + 1, b + 0


@pytest.mark.sampled(every=4, classes=("program", "inputs"))
@pytest.mark.parametrize("grad_mode", [True, False], ids=["training", "no_grad"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inputs", list(REINTERPRETED))
@pytest.mark.parametrize("program", [add_through_the_bits, scale_then_read_the_bits], ids=lambda f: f.__name__)
def test_an_alias_of_another_dtype_written_or_read(program, inputs, backend, grad_mode):
    check(program, lambda call: REINTERPRETED[inputs](), backend, calls=2, grad_mode=grad_mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_of_a_non_leaf_reach_its_root(backend):
    """`y = w * 1` viewed as `y[:5]` and as bits `y.detach()[3:].view(torch.int32)`: the write through the bits is no
    autograd op, and `w.grad` is eager's, computed from the written values."""
    def f(a, b):
        b[0].bitwise_or_(1 << 22)
        return (a * a).sum()

    grads = []
    for fn in (f, kiln.compile(f, backend=backend)):
        w = _floats().requires_grad_()
        y = w * 1
        fn(y[:5], y.detach()[3:].view(torch.int32)).backward()
        grads.append((y.detach(), w.grad))
    for e, a in zip(*grads):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_saved_value_written_through_a_detached_alias_raises_at_backward(backend):
    """As in eager: the forward runs, and the backward finds `a` modified since it was saved."""
    results = []
    for fn in (saved_then_written, kiln.compile(saved_then_written, backend=backend)):
        a = _floats().requires_grad_()
        out, _ = fn(a, a.detach()[2:])
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
        results.append(a.detach())
    torch.testing.assert_close(results[1], results[0])


def test_a_write_through_a_detached_alias_moves_the_version_counter():
    """Eager's write through `a.detach()` moves `a`'s version counter (they share it): compiled, too."""
    def f(a, b):
        b.add_(1)
        return a * 2

    a = _floats().requires_grad_()
    before = a._version
    kiln.compile(f, backend="aot_eager")(a, a.detach())
    assert a._version > before


@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_aliasing_between_calls_recompiles(backend):
    """A detached alias, a bit view, another tensor's bit view, the same storage at another offset: each call as
    eager's (the capture guards which inputs share storage and where, and each input's dtype and requires_grad)."""
    kinds = [
        lambda x, y: (x, x.detach()[1:]),
        lambda x, y: (x, x.detach().view(torch.int32)),
        lambda x, y: (x, y.view(torch.int32)),
        lambda x, y: (x, x.detach()[2:].view(torch.int32)),
        lambda x, y: (x, x.detach()[1:]),
    ]
    compiled = kiln.compile(write_the_second_read_the_first, backend=backend)
    check(write_the_second_read_the_first,
          lambda call: kinds[call](_floats().requires_grad_(), _floats() + 3), backend, calls=len(kinds),
          compiled=compiled)


# what one base cannot hold: the graph runs as captured, loudly, with eager's results
UNHOLDABLE = {
    # int16 elements at odd places are halves of the float32 base's elements (the base has the dtype that carries
    # the gradients)
    "a narrower alias not of whole elements": lambda: (lambda a: (a, a.detach().view(torch.int16)[1::2]))(
        _floats().requires_grad_()),
    # two members that require grad in two dtypes: no one base carries both gradients
    "two dtypes that require grad": lambda: (lambda x: (x.requires_grad_(),
                                                        x.detach().view(torch.bfloat16).requires_grad_()))(
        _floats(torch.float16)),
}


@pytest.mark.allows_fallback(NO_ONE_BASE)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inputs", list(UNHOLDABLE))
def test_aliases_no_one_base_holds_run_as_captured(inputs, backend):
    def f(a, b):
        with torch.no_grad():
            b[0].zero_()
        return a * 2, b * 1

    before = len(kiln.fallbacks.records())
    check(f, lambda call: UNHOLDABLE[inputs](), backend, calls=2)
    assert any("no one base input can hold them" in f.cause for f in kiln.fallbacks.records()[before:])

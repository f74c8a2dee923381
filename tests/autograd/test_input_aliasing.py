"""Inputs that share storage, one of them written by the graph (issue 21, class 3).

`f(a, b)` with `a.add_(1)` reads the write through `b` when called as `f(x, x)` or `f(x, x[:3])`.
The capture guards which inputs share storage (so a call with other aliasing recompiles) and the
autograd stage compiles such a graph with one base input per storage (`aliased_inputs.py`).
Each case runs eagerly and compiled on identically built arguments (`differential.check`).
"""
import pytest
import torch

import kiln
from support.differential import check

BACKENDS = ["aot_eager", "inductor"]


def add_then_read(a, b):
    a.add_(1)
    return a[:3] + b[:3]


def write_second(a, b):
    b.mul_(2)
    return a * 1


def write_both(a, b):
    a.add_(1)
    b.mul_(2)
    return a[:2] - b[:2]


def write_through_view(a, b):
    a[0] = 5.0
    return b.clone()


def returns_the_inputs(a, b):
    a.add_(1)
    return a, b


def returns_a_view(a, b):
    a.add_(1)
    return b[1:], b.detach()


def three_inputs(a, b, c):
    a.add_(1)
    return a[:2] + b[:2] + c[:2]


def _vector(n: int = 8):
    return torch.linspace(-1.0, 2.0, n)


ALIASINGS = {
    "same": lambda x, y: (x, x),
    "prefix": lambda x, y: (x, x[:3]),
    "prefix_first": lambda x, y: (x[:3], x),
    "overlap": lambda x, y: (x[1:4], x[2:5]),
    "interleaved": lambda x, y: (x[::2], x[1::2]),
    "detached": lambda x, y: (x, x.detach()),
    "distinct": lambda x, y: (x, y),
}


@pytest.mark.sampled(every=2, classes=("program", "aliasing"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aliasing", list(ALIASINGS))
@pytest.mark.parametrize("program", [add_then_read, write_second, write_both, write_through_view, returns_the_inputs,
                                     returns_a_view], ids=lambda f: f.__name__)
def test_aliased_inputs_match_eager(program, aliasing, backend):
    check(program, lambda call: ALIASINGS[aliasing](_vector(), _vector() + 3), backend, calls=2)


@pytest.mark.parametrize("backend", BACKENDS + ["eager"])
def test_changing_aliasing_between_calls_recompiles(backend):
    """One compiled function called with each aliasing in turn, and back: every call as eager."""
    order = ["distinct", "same", "prefix", "overlap", "distinct", "interleaved", "same", "overlap"]
    compiled = kiln.compile(add_then_read, backend=backend)
    check(add_then_read, lambda call: ALIASINGS[order[call]](_vector(), _vector() + 3), backend,
          calls=len(order), compiled=compiled)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_aliasing_at_other_offsets(backend):
    """`(x[1:4], x[2:5])` then `(x[3:6], x[4:7])`: the same shapes and relative offset, other places."""
    check(add_then_read, lambda call: (lambda x: (x[1 + 2 * call:4 + 2 * call], x[2 + 2 * call:5 + 2 * call]))(
        _vector(12)), backend, calls=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_inputs_two_aliased(backend):
    check(three_inputs, lambda call: (lambda x, y: (x, y, x[1:]) if call % 2 else (x[1:], y, x))(_vector(), _vector()),
          backend, calls=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_alias(backend):
    def f(a, b):
        a.add_(1)
        return b * 2

    check(f, lambda call: (lambda x: (x, x.t()))(torch.arange(12.0).view(3, 4)), backend, calls=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_changing_sizes_with_aliasing(backend):
    def make(call):
        x = _vector(6 + 2 * call)
        return (x, x[: x.shape[0] // 2])

    check(add_then_read, make, backend, calls=4)


class Accumulator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        self.total.add_(x)
        return self.total * x


@pytest.mark.sampled(every=2, classes=("argument",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", ["buffer", "buffer_view", "other"])
def test_buffer_passed_as_input(backend, argument):
    """A module writes its buffer while its input is that buffer, a view of it, or another tensor."""
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = Accumulator()
        m.total.copy_(torch.arange(4.0))
        fn = kiln.compile(m, backend=backend) if compiled else m
        outs = []
        for _ in range(2):
            x = {"buffer": m.total, "buffer_view": m.total[::1], "other": torch.ones(4)}[argument]
            outs.append(fn(x).clone())
        results.append((outs, m.total.clone()))
    for e, a in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(a, e)
    torch.testing.assert_close(results[1][1], results[0][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_aliased_inputs_that_require_grad(backend):
    """Two views of one tensor that requires grad, one written: values and gradients as eager's."""
    def f(a, b):
        a.mul_(2)
        return (a[:3] * b[:3]).sum()

    grads = []
    for fn in (f, kiln.compile(f, backend=backend)):
        w = torch.linspace(0.5, 2.0, 6, requires_grad=True)
        y = w * 1
        out = fn(y, y[1:4])
        out.backward()
        grads.append((out.detach(), y.detach(), w.grad))
    for e, a in zip(*grads):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_aliased_inputs_of_two_dtypes(backend):
    """A float and an int view of one storage: the int member reinterprets the base's bytes
    (test_detached_and_reinterpreted_aliases.py has the other dtypes and itemsizes)."""
    def f(a, b):
        a.mul_(2)
        return b + 1

    check(f, lambda call: (lambda x: (x, x.view(torch.int32)))(torch.linspace(1.0, 2.0, 4)), backend, calls=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clone_of_an_input_is_a_new_tensor(backend):
    """`b.clone()` is lowered as `b`; the compiled graph still returns storage of its own."""
    def f(a, b):
        a[0] = 5.0
        return b.clone(), a.clone(), b

    check(f, lambda call: (_vector(), _vector() + 3), backend, calls=2)


@pytest.mark.sampled(every=2, classes=("aliasing",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aliasing", ["same", "prefix", "detached", "distinct"])
def test_read_only_aliased_inputs_that_require_grad(backend, aliasing):
    """No write: nothing to specialize, and gradients through both aliases add up as in eager."""
    def f(a, b):
        return a[:3] * b[:3], a, b[1:]

    check(f, lambda call: ALIASINGS[aliasing](_vector().requires_grad_(), (_vector() + 3).requires_grad_()), backend,
          calls=2)


def transpose_in_place(a, b):
    """`t_` changes b's geometry, not its data: no write for the aliasing to carry (fuzz seed 12188)."""
    out = a.t() * 2
    b.t_()
    return out, b + 1


def write_through_detached(a, b):
    """b is a detached alias of a, which requires grad: eager's write through b is no autograd op."""
    out = a * 2
    b.mul_(3)
    return out, b * 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [
    transpose_in_place,
    write_through_detached], ids=lambda f: f.__name__)
def test_a_detached_alias_of_an_input_that_requires_grad(program, backend):
    """Fuzz seed 12188: `b = a.detach()[:2]` written in place raised "a view of a leaf Variable that requires
    grad is being used in an in-place operation" where eager runs."""
    def make_args(call):
        a = torch.linspace(-1.0, 2.0, 9, dtype=torch.float64).reshape(3, 3).requires_grad_()
        return a, a.detach()[:2]

    check(program, make_args, backend, calls=2, loss_from=[0])


def zero_a_column_without_grad(b, c):
    with torch.no_grad():
        c[..., :1].zero_()
    return b.sum(1) * 3


def scale_a_column(b, c):
    c[..., :1].mul_(2)
    return b.sum(1) * 3


# (b, c) of a (5, 3) tensor: c inside b (the base is taken from b), or overlapping without either holding the other
# (from the tensor both view)
ALIASES = {"nested": lambda a: (a[1:], a[1:][::2]), "overlapping": lambda a: (a[2:5], a[1:3])}


@pytest.mark.sampled(every=2, classes=("program", "leaf", "aliases"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aliases", list(ALIASES))
@pytest.mark.parametrize("leaf", [True, False], ids=["views of a leaf", "views of a non-leaf"])
@pytest.mark.parametrize("program", [zero_a_column_without_grad, scale_a_column], ids=lambda f: f.__name__)
def test_the_gradient_reaches_elements_beyond_the_first_alias(program, leaf, aliases, backend):
    """Fuzz seed 301393: `b = a[1:]`, `c = b[::2]`, c written: the base holding both was taken from c, and the
    gradient of `b.sum(1)` reached only c's rows of `a` (a view's backward feeds only the elements it views)."""
    grads = []
    for fn in (program, kiln.compile(program, backend=backend)):
        w = torch.linspace(-1.0, 2.0, 15).reshape(5, 3).clone().requires_grad_()
        try:
            out = fn(*ALIASES[aliases](w if leaf else w * 1))
        except RuntimeError as e:  # eager's in-place write through a view of a leaf that requires grad
            grads.append(type(e))
            continue
        out.sum().backward()
        grads.append((out.detach(), w.grad))
    if isinstance(grads[0], type):
        assert grads[1] is grads[0]
        return
    for e, a in zip(*grads):
        torch.testing.assert_close(a, e)


def values_read_through_a_view_of_a_written_base(a, c):
    """Each result is a new tensor in eager; the lowering reads each as the one element or row of `c` it is."""
    summed, cloned, contiguous = c.sum(-1), c.clone(), c[:1].contiguous()
    a[-1:] = 0  # a write into the shared storage: the graph takes one base input, `c` an as_strided view of it
    return summed, cloned, contiguous


@pytest.mark.parametrize("backend", BACKENDS)
def test_values_read_through_an_aliased_inputs_view_are_new_tensors(backend):
    """With aliased inputs one of which is written, the graph reads `c` through an as_strided view of the base
    input that ATen makes: a sum over a dim of one element, a clone or a contiguous copy of it is lowered as
    that view, and was returned as it, on the input's memory (fuzz seed 442367: a later write into the input
    changed the output)."""
    def arguments(call):
        a = torch.arange(3.0) + call
        return a, a[1::2]

    check(values_read_through_a_view_of_a_written_base, arguments, backend, calls=2)

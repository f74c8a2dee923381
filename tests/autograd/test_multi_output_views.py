"""Outputs of view ops with several outputs (`unbind`, `split`, `chunk`) cannot be modified in place under autograd.

Eager raises ("Output 0 of Split is a view and is being modified inplace ... returns multiple views") when
such a view of a tensor that requires grad is written. kiln rebuilds outputs that view each other after the
graph (signature.py), or computes them in the graph; either way they are marked again as eager's are, so a
write raises whether it happens inside the compiled function (after a graph break) or in the caller. Without
grad the writes are allowed, in eager and in kiln alike.
"""
import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", "inductor"]

MULTI_OUTPUT_VIEWS = {
    "unbind": lambda t: t.unbind(0),
    "split": lambda t: t.split(1),
    "chunk": lambda t: t.chunk(2),
    "split_with_sizes": lambda t: t.split([1, 1]),
    "tensor_split": lambda t: t.tensor_split(2),
}

WRITES = {
    "add_": lambda v: v.add_(1),
    "mul_": lambda v: v.mul_(3),
    "setitem": lambda v: v.__setitem__(0, 5.0),
}


def _outcome(fn, x):
    """('raised', exception type) or ('returned', values), for comparing eager with kiln."""
    try:
        out = fn(x)
    except RuntimeError as e:
        assert "modified inplace" in str(e) or "in-place" in str(e), e
        return "raised", type(e)
    return "returned", [o.detach() for o in (out if isinstance(out, (tuple, list)) else (out,))]


def _same(eager, compiled):
    assert eager[0] == compiled[0], f"eager {eager}, kiln {compiled}"
    if eager[0] == "returned":
        assert all(torch.equal(e, k) for e, k in zip(eager[1], compiled[1]))


@pytest.mark.sampled(every=3, classes=("view", "write"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("view", list(MULTI_OUTPUT_VIEWS))
def test_a_write_inside_the_function_raises_as_in_eager(view, write, backend):
    def f(x):
        y = x * 2
        parts = MULTI_OUTPUT_VIEWS[view](y)
        WRITES[write](parts[0])
        return y

    x = torch.randn(2, 3, requires_grad=True)
    _same(_outcome(f, x), _outcome(kiln.compile(f, backend=backend), x))


def _writes_first_part(fn):
    """The caller writes the first view the (compiled) function returned."""
    def run(x):
        out = fn(x)
        return (out[1][0] if isinstance(out, tuple) else out).add_(1)
    return run


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", list(MULTI_OUTPUT_VIEWS))
def test_a_write_to_returned_views_raises_as_in_eager(view, backend):
    """The views leave the compiled function with their base, and the caller writes one."""
    def f(x):
        y = x * 2
        return y, MULTI_OUTPUT_VIEWS[view](y)

    x = torch.randn(2, 3, requires_grad=True)
    _same(_outcome(_writes_first_part(f), x), _outcome(_writes_first_part(kiln.compile(f, backend=backend)), x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", list(MULTI_OUTPUT_VIEWS))
def test_a_write_to_a_view_returned_alone_raises_as_in_eager(view, backend):
    """tensor_split makes each piece with its own view op: eager allows the write, and so does kiln."""
    def f(x):
        return MULTI_OUTPUT_VIEWS[view](x * 2)[0]

    x = torch.randn(2, 3, requires_grad=True)
    _same(_outcome(_writes_first_part(f), x), _outcome(_writes_first_part(kiln.compile(f, backend=backend)), x))


# single views of an intermediate, returned without it: eager's output is an ordinary view, writable in place
SINGLE_VIEWS = {
    "select": lambda t: t[0],
    "transpose": lambda t: t.t(),
    "slice of a flat view": lambda t: t.view(-1)[1:4],
    "diagonal": lambda t: t.diagonal(),
    "expand": lambda t: t[:1].expand(3, 3),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", list(SINGLE_VIEWS))
def test_a_view_of_an_intermediate_returned_alone_is_written_as_in_eager(view, backend):
    """The compiled Function returns the intermediate and the view is rebuilt on it, so autograd does not mark
    it a view made inside a custom Function: the caller's write and the gradients after it are eager's."""
    def f(x):
        return SINGLE_VIEWS[view](x * 2), x.sum()

    def write_then_backward(fn, x):
        out, total = fn(x)
        try:
            out.mul_(3)
        except RuntimeError as e:
            return type(e), None
        (out * torch.arange(out.numel()).view(out.shape)).sum().backward()
        return out.detach(), x.grad

    eager = write_then_backward(f, torch.ones(3, 3, requires_grad=True))
    compiled = write_then_backward(kiln.compile(f, backend=backend), torch.ones(3, 3, requires_grad=True))
    assert type(eager[0]) is type(compiled[0])
    if isinstance(eager[0], torch.Tensor):
        assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("view", list(MULTI_OUTPUT_VIEWS))
def test_writes_without_grad_are_allowed(view, backend):
    def f(x):
        y = x * 2
        parts = MULTI_OUTPUT_VIEWS[view](y)
        parts[0].add_(1)
        return y, parts[1]

    x = torch.randn(2, 3)
    _same(_outcome(f, x), _outcome(kiln.compile(f, backend=backend), x))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gradients_flow_through_a_marked_view(backend):
    """Marking the views does not change what they compute or how gradients reach the inputs."""
    def f(x):
        return (x * 2).unbind(0)

    x = torch.randn(2, 3, requires_grad=True)
    xk = x.detach().clone().requires_grad_()
    sum(p.sum() * (i + 1) for i, p in enumerate(f(x))).backward()
    sum(p.sum() * (i + 1) for i, p in enumerate(kiln.compile(f, backend=backend)(xk))).backward()
    assert torch.equal(x.grad, xk.grad)

"""Outputs that view an input whose elements share memory (expanded, broadcast, overlapping `as_strided`).

kiln rebuilds an output that views an input (or another output) after the call. Rebuilt with one `as_strided`
of the input, its backward spread each gradient evenly over the elements sharing a memory location (fuzz
seed 100252: `t1 = d.view(d.shape); return t1, t1[1:]` gave `d` a gradient of 2.5 where eager's is 1 and 3);
eager's slice gives each element its own. kiln replays the output's own view ops instead
(kiln/autograd/view_replay.py). Eager and kiln side by side: values, strides, aliasing, requires_grad, is_leaf,
the backward's gradients, and writes through each output afterwards.
"""
import pytest
import torch

from support.differential import check

BACKENDS = ["aot_eager", "inductor"]


def view_then_slice(d):
    t1 = d.view(d.shape)
    return t1, t1[1:]


def select_a_row(d):
    return d[1], d * 2


def diagonal(d):
    return d.diagonal(), d.sum()


def transpose_of_a_narrow(d):
    return d.narrow(0, 1, 2).t()


def unsqueeze_and_expand(d):
    return d.unsqueeze(0), d[0].expand(2, -1)


def unbind_rows(d):
    return d.unbind(0)


def detached_slice_beside_a_view(d):
    return d.detach()[1:], d[:2]


def slice_under_no_grad(d):
    with torch.no_grad():
        v = d[1:]
    return v, d * 1


def views_of_an_expanded_intermediate(d):
    e = (d * 2)[:1].expand(d.shape[0], -1)
    return e, e[1:], e.t()[0]


PROGRAMS = [view_then_slice, select_a_row, diagonal, transpose_of_a_narrow, unsqueeze_and_expand, unbind_rows,
            detached_slice_beside_a_view, slice_under_no_grad, views_of_an_expanded_intermediate]


def _row(call):
    return torch.linspace(-1.0, 2.0, 3 + call)


def expanded_leaf(call):
    """A leaf that requires grad and is itself expanded (the fuzzer's `layout='expand'`)."""
    return [_row(call)[None].expand(4, -1).requires_grad_()]


def broadcast_leaf(call):
    return [_row(call).expand(4, -1).requires_grad_()]


def windows_leaf(call):
    """Overlapping rows of one vector: row i is elements i .. i+n-1."""
    n = 3 + call
    return [torch.linspace(-1.0, 2.0, n + 3).as_strided((4, n), (1, 1)).requires_grad_()]


def expanded_view_of_a_leaf(call):
    """Not a leaf: the expansion of a leaf (input 0, whose gradient is compared), passed to the program."""
    w = _row(call)[None].requires_grad_()
    return [w, w.expand(4, -1)]


def expanded_without_grad(call):
    return [_row(call)[None].expand(4, -1)]


INPUTS = {f.__name__: f for f in (expanded_leaf, broadcast_leaf, windows_leaf, expanded_view_of_a_leaf,
                                  expanded_without_grad)}


def _on_last_input(program):
    """`program` of the last argument: the others are the leaves an expanded input was made of."""
    def run(*args):
        return program(args[-1])
    run.__name__ = program.__name__
    return run


@pytest.mark.sampled(every=2, classes=("program", "inputs"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_output_viewing_an_overlapping_input(program, inputs, backend):
    check(_on_last_input(program), INPUTS[inputs], backend, calls=2)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [view_then_slice, transpose_of_a_narrow, views_of_an_expanded_intermediate],
                         ids=lambda f: f.__name__)
def test_output_viewing_an_overlapping_input_dynamic(program, backend):
    """Sizes that change between calls, as symbols: the replayed views' sizes are computed per call."""
    check(program, expanded_leaf, backend, calls=3, dynamic=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [view_then_slice, select_a_row, unbind_rows], ids=lambda f: f.__name__)
def test_output_viewing_an_overlapping_input_without_grad_mode(program, backend):
    check(program, expanded_leaf, backend, calls=2, grad_mode=False)


def seed_100252(a, b, c, d):
    t1 = d.view(d.shape)
    acc = [b * 2, (b + 1) * 2]
    return [t1, acc[0] + acc[-1], t1[1:]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_seed_100252(backend):
    def make(call):
        n = (5, 4)[call]
        a = torch.arange(n * n * 3, dtype=torch.int32).reshape(n, n, 3)
        c = torch.arange(2 * n * 2, dtype=torch.int32).reshape(2, n, 2)[:1].expand(2, n, 2)
        return [a, a[1:], c, torch.linspace(-1.0, 1.0, n)[None].expand(n, n).requires_grad_()]
    check(seed_100252, make, backend, calls=2)

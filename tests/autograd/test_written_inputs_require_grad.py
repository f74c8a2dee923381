"""An input that does not require grad, written in place with a value that does, requires grad after the call.

Eager's in-place op puts the write into the input's history (`b[...] = d` gives `b` a CopySlices node), so a
backward from the input reaches `d`. kiln runs such a write on a copy inside the graph and copies the
result into the input under autograd after the call, as it does for inputs that already required grad.
"""
import pytest
import torch

import kiln


def fill_with(b, d):
    b[...] = d


def copy_into(b, d):
    b.copy_(d * 2)
    return b.sum()


def add_in_place(b, d):
    b.add_(d.exp())
    return None


def write_a_slice(b, d):
    b[1:].mul_(d)
    return b[0] * 3


def written_then_read(b, d):
    b[...] = d.sin()
    return b * b


PROGRAMS = [fill_with, copy_into, add_in_place, write_a_slice, written_then_read]


def make():
    return torch.linspace(-1.0, 1.0, 6).reshape(2, 3), torch.tensor(0.7, requires_grad=True)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_input_written_with_a_value_that_requires_grad(program, backend):
    compiled = kiln.compile(program, backend=backend)
    sides = []
    for fn in (program, compiled):
        b, d = make()
        out = fn(b, d)
        state = (b.requires_grad, b.is_leaf, b.grad_fn is None)
        b.sum().backward()
        sides.append((b.detach(), out.detach() if out is not None else None, state, d.grad))
    (e_b, e_out, e_state, e_grad), (k_b, k_out, k_state, k_grad) = sides
    assert k_state == e_state
    torch.testing.assert_close(k_b, e_b)
    if e_out is not None:
        torch.testing.assert_close(k_out, e_out)
    torch.testing.assert_close(k_grad, e_grad)

"""A value autograd saved for the backward, written in place afterwards: eager's forward runs and its backward
raises. Tracing the joint graph meets the same error at compile time; kiln must not fail the compile, but
return the forward's values and raise eager's error from the backward.
"""
import pytest
import torch

import kiln


def abs_of_saved_reciprocal(d):
    t = d.reciprocal()  # saves its result
    return t.abs_()


def exp_transposed_in_place(d):
    t = d.exp()  # saves its result
    t.t_()
    return (t - 1).sum(0)


def input_of_mul_written(d):
    t = d * 2
    u = t * t  # saves t
    t.add_(1)
    return u, t


def sigmoid_then_zero(d):
    s = d.sigmoid()
    y = s * 3
    s.zero_()
    return y


PROGRAMS = [abs_of_saved_reciprocal, exp_transposed_in_place, input_of_mul_written, sigmoid_then_zero]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_backward_raises_as_eager(program, backend):
    compiled = kiln.compile(program, backend=backend)
    results = []
    for fn in (program, compiled):
        d = torch.linspace(0.5, 2.0, 6).reshape(2, 3).requires_grad_()
        out = fn(d)
        outs = out if isinstance(out, tuple) else (out,)
        with pytest.raises(RuntimeError) as error:
            sum(o.sum() for o in outs).backward()
        results.append(([o.detach() for o in outs], str(error.value).split(" Hint:")[0]))
    (e_outs, e_error), (k_outs, k_error) = results
    torch.testing.assert_close(k_outs, e_outs)
    assert k_error == e_error

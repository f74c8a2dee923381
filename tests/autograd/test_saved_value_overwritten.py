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


def prod_rows_then_an_empty_write(d):
    t = d.prod(1)  # saves its result, whichever formula its backward picks by the data (kiln's EagerProd too)
    t[:0].add_(1)  # writes nothing, and counts as a write all the same (fuzz seed 412285)
    return t


def prod_then_add(d):
    t = d.prod()
    t.add_(1)
    return t


PROGRAMS = [abs_of_saved_reciprocal, exp_transposed_in_place, input_of_mul_written, sigmoid_then_zero,
            prod_rows_then_an_empty_write, prod_then_add]


@pytest.mark.sampled(every=2, classes=("program",))
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


# Written after the graph: a graph input or output whose value eager's backward saves, written in place once
# the compiled graph returned (after a graph break, or by the caller). Eager's backward raises if, and only if,
# a gradient reaches the node that saved it.

def amin_result_through_a_view(a):
    t = (a * 2 + 1).amin(0, keepdim=True)  # saves its result
    v = t.reshape(-1)
    print(end="")  # graph break
    v.mul_(3)
    return t


def exp_result_after_break(a):
    t = a.exp()  # saves its result
    print(end="")
    t.add_(1)
    return t


def input_of_mul_after_break(x, w):
    y = x * w  # saves x, which does not require grad
    print(end="")
    x.add_(1)
    return y


def max_indices_after_break(x, w):
    v, i = (x * w).max(0)  # saves the indices
    print(end="")
    i.zero_()
    return v


def written_but_not_reached(x, w):
    t = w.exp()  # saved, written, but the loss below never reaches exp's backward
    u = x * 2
    print(end="")
    t.add_(1)
    return u + w


AFTER_THE_GRAPH = [amin_result_through_a_view, exp_result_after_break, input_of_mul_after_break,
                   max_indices_after_break, written_but_not_reached]


def backward_outcome(fn, args):
    """The output's value and the backward's error (its type and message before the hint), or the grads."""
    out = fn(*args)
    try:
        out.sum().backward()
    except RuntimeError as error:
        return out.detach(), (type(error), str(error).split(", which is")[0].split(" is at version")[0])
    return out.detach(), [a.grad for a in args]


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", AFTER_THE_GRAPH, ids=lambda f: f.__name__)
def test_value_saved_by_eager_written_after_the_graph(program, backend):
    compiled = kiln.compile(program, backend=backend)
    def make(n):
        args = [torch.linspace(-1.0, 2.0, 2 * n).reshape(n, 2), torch.linspace(0.5, 1.5, 2 * n).reshape(n, 2)]
        args[-1].requires_grad_()
        return args[-program.__code__.co_argcount:]

    for n in (3, 4):
        (e_out, e_result), (k_out, k_result) = backward_outcome(program, make(n)), backward_outcome(compiled, make(n))
        torch.testing.assert_close(k_out, e_out)
        if isinstance(e_result, tuple):
            assert k_result == e_result
        else:
            torch.testing.assert_close(k_result, e_result)

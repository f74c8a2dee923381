"""A graph break inside a loop: the frame is stepped through natively and the functions it calls are compiled.

torch.compile does not resume inside a loop: a break with a jump back ahead of it skips the frame (it runs
eagerly, and the functions it calls are compiled as frames of their own). kiln does the same
(`bytecode.loops_back_after`, `breaks.StepsNatively`) rather than making a graph per iteration. Each case
compares with eager and kiln's graph count with torch.compile's, measured here.
"""
import pytest
import torch

import kiln
from support.capture import CountingBackend, assert_same


def explicit_break_in_loop(xs):
    out = 0
    for x in xs:
        out = out + x.sin()
        torch._dynamo.graph_break()
        out = out * 2
    return out


def data_dependent_size_in_comprehension(xs):
    return [torch.nonzero(x).sum() * 2 + x.cos().sum() for x in xs]


def branch_on_value_in_enumerate_zip(a, b):
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x.sum() > 0:
            out.append(x * y + i)
        else:
            out.append(x - y)
    return out


def _helper(x):
    return x.relu() * 3 + 1


def loop_calling_a_compiled_helper(xs):
    total = xs[0] * 0
    for x in xs:
        total = total + _helper(x)
        if total.sum() > 100:  # a break in the loop: the helper is still compiled, on its own
            break
    return total


def break_after_the_loop(xs):
    total = sum(x.exp() for x in xs)
    print("done")
    return total.log()


def break_in_a_loop_of_a_function_with_a_block(xs, break_first=False):
    """Stepped through natively, the frame meets its `with` on a manager it got natively, and enters it itself.
    `break_first`: a break before the loop puts the loop in a continuation."""
    if break_first:
        print(end="")
    out = []
    for x in xs:
        with torch.no_grad():
            y = x * 2
        print(end="")
        out.append(y + 1)
    return out


def break_inside_a_block_in_a_loop(xs):
    out = []
    for x in xs:
        with torch.enable_grad():
            print(end="")
            y = x.exp()
        out.append(y.sum())
    return out


def block_before_the_loop(xs):
    with torch.no_grad():
        scale = xs[0].abs().max()
    return [x * scale for x in xs if x.sum() > -100]


def _scaled(x, *factors):
    for factor in factors:
        x = x * factor
    return x


def star_call_in_a_stepped_loop(xs):
    """`f(x, *args)` on 3.11 is BUILD_LIST, LIST_EXTEND, LIST_TO_TUPLE: with `args` known only to the natively
    stepped loop, each runs in the output program (a continuation that could not raised RuntimeError before)."""
    out = []
    for i, x in enumerate(xs):
        torch._dynamo.graph_break()
        factors = (2.0,) * i
        out.append(_scaled(x, *factors))
    return out


CASES = {
    "explicit_break_in_loop": (explicit_break_in_loop, ([torch.randn(3) for _ in range(4)],)),
    "data_dependent_size_in_comprehension": (data_dependent_size_in_comprehension,
                                             ([torch.randn(3) for _ in range(4)],)),
    "branch_on_value_in_enumerate_zip": (branch_on_value_in_enumerate_zip, (torch.randn(4, 3), torch.randn(4, 3))),
    "loop_calling_a_compiled_helper": (loop_calling_a_compiled_helper, ([torch.randn(3) for _ in range(3)],)),
    "break_after_the_loop": (break_after_the_loop, ([torch.randn(3) for _ in range(3)],)),
    "break_in_a_loop_of_a_function_with_a_block": (break_in_a_loop_of_a_function_with_a_block,
                                                   ([torch.randn(3) for _ in range(3)],)),
    "break_inside_a_block_in_a_loop": (break_inside_a_block_in_a_loop, ([torch.randn(3) for _ in range(3)],)),
    "block_before_the_loop": (block_before_the_loop, ([torch.randn(3) for _ in range(3)],)),
}


@pytest.mark.allows_fallback("graph_break: breaks torch.compile takes too (data-dependent values, print)")
@pytest.mark.parametrize("name", CASES)
def test_break_in_loop_gives_torch_compiles_graph_count(name):
    fn, args = CASES[name]
    torch._dynamo.reset()
    counter = CountingBackend()
    torch.compile(fn, backend=counter)(*args)
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(2):
        assert_same(fn(*args), compiled(*args))
    assert backend.graphs <= counter.graphs


def test_helper_called_from_a_natively_stepped_loop_is_compiled():
    xs = [torch.randn(3) for _ in range(3)]
    backend = CountingBackend()
    compiled = kiln.compile(loop_calling_a_compiled_helper, backend=backend)
    assert_same(loop_calling_a_compiled_helper(xs), compiled(xs))
    assert backend.graphs >= 1  # the helper's graph


@pytest.mark.allows_fallback("graph_break: the explicit break in the loop")
def test_star_call_of_values_only_the_stepped_loop_knows():
    xs = [torch.randn(3) for _ in range(3)]
    compiled = kiln.compile(star_call_in_a_stepped_loop, backend="eager")
    for _ in range(2):
        assert_same(star_call_in_a_stepped_loop(xs), compiled(xs))


@pytest.mark.allows_fallback("graph_break: print, which torch.compile breaks on too")
def test_a_continuation_with_a_block_steps_its_loop_natively():
    """After the first break the loop is in a continuation, which has no frame to run eagerly: it is stepped
    through natively, entering its `with` itself (before, it could not, and made a graph per iteration).
    torch.compile runs its resume function, a real frame, eagerly: the same graphs."""
    xs = [torch.randn(3) for _ in range(3)]
    torch._dynamo.reset()
    reference = CountingBackend()
    torch.compile(break_in_a_loop_of_a_function_with_a_block, backend=reference)(xs, True)
    backend = CountingBackend()
    compiled = kiln.compile(break_in_a_loop_of_a_function_with_a_block, backend=backend)
    for _ in range(2):
        assert_same(break_in_a_loop_of_a_function_with_a_block(xs, True), compiled(xs, True))
    assert backend.graphs == reference.graphs

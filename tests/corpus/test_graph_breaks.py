"""Graph breaks, counted: each case breaks where Dynamo's tests break (printing, .item(), data-dependent control
flow, calls into code that cannot be traced) in a different position (nested calls, inside try, with, loops,
comprehensions, closures), and kiln must resume with the same values and no more graphs than torch.compile."""
import random

import numpy as np
import pytest
import torch

from .reference import Table, check, falls_back, globals_state, t

torch.manual_seed(0)
cases = Table()
A, B = t(4), t(4)
LOG = []
IN_LOOP = "a graph break inside a loop makes torch.compile run the rest of the frame eagerly"


def _opaque(x):
    """Calls into numpy: opaque to a graph, so the caller breaks around it."""
    return float(np.asarray(x.detach()).sum())


def _level2(x):
    y = x * 2
    print(end="")
    return y + 1


def _level1(x):
    return _level2(x + 1) * 3


@cases((A,))
def two_breaks_in_sequence(a):
    b = a + 1
    print(end="")
    c = b * 2
    print(end="")
    return c - 1


@cases((A,))
def break_two_calls_deep(a):
    return _level1(a) - 1


@cases((A, B))
def break_with_many_live_values(a, b):
    x, y, z = a + b, a - b, [a, b, 3]
    w = {"k": a * b, "n": 2}
    n = a.sum().item()
    return x * y + z[0] * z[2] + w["k"] * w["n"] + n


@cases((A,))
def break_in_try_body(a):
    try:
        b = a * 2
        print(end="")
        return b + 1
    except ValueError:
        return a


@cases((A,))
def break_in_finally(a):
    try:
        b = a * 2
    finally:
        print(end="")
    return b + 1


@cases((A,), torch_gives_up=IN_LOOP)
def break_in_comprehension(a):
    return [a * v.item() for v in a[:2]]


@cases((A,))
def break_in_closure(a):
    scale = 3

    def inner(x):
        print(end="")
        return x * scale
    return inner(a + 1)


@cases((A,))
def break_in_lambda_via_map(a):
    return list(map(lambda v: v * float(v.sum()), [a, a + 1]))


@cases((A,))
def break_in_while_loop(a):
    i = 0
    while i < 2:
        a = a * 2
        i += 1
    print(end="")
    return a


@cases((A,), state=globals_state(globals(), LOG=[]),
       marks=falls_back("graph_break: numpy, traced by torch.compile"))
def break_after_side_effect_then_more(a):
    LOG.append("before")
    b = a + 1
    LOG.append(_opaque(b) > 1e9)
    LOG.append("after")
    return b * 2


@cases((A,), marks=falls_back("graph_break: numpy, traced by torch.compile"))
def numpy_call_breaks(a):
    return a * _opaque(a)


# random.seed reaches super().seed(...) while a break is pending: the super() proxy is rebuilt natively
@cases((A,))
def python_random_breaks(a):
    random.seed(3)
    return a * random.random()


@cases((A,))
def tensor_truthiness_breaks(a):
    if a.max() > 0:
        a = a - 1
    if a.min() < -100:
        a = a * 0
    return a


@cases((A,), torch_gives_up=IN_LOOP)
def data_dependent_while(a):
    steps = 0
    while a.abs().max() > 0.5 and steps < 10:
        a = a * 0.5
        steps += 1
    return a, steps


@cases((A,))
def break_returns_container(a):
    b = a + 1
    print(end="")
    return {"b": b, "parts": [b * 2, (b * 3,)]}


@cases((t(4, grad=True),))
def break_with_grad_input(x):
    y = x.sin()
    print(end="")
    return y * x


@cases((A,))
def break_inside_user_method(a):
    class Block:
        def __init__(self):
            self.scale = 2.0

        def __call__(self, x):
            y = x * self.scale
            print(end="")
            return y + 1
    return Block()(a)


@cases((A,))
def item_used_in_shape(a):
    n = int(a.abs().sum().item() > -1) + 1
    return a.repeat(n)


@cases((A,))
def tolist_loop(a):
    total = 0.0
    for v in a.tolist():
        total += v
    return a + total


@cases((A,))
def graph_break_api(a):
    b = a + 1
    torch._dynamo.graph_break()
    return b * 2


@cases((A,))
def disabled_inner_function(a):
    return _eager_only(a) * 2


@torch.compiler.disable
def _eager_only(x):
    return x + 1


@cases((A,))
def break_then_no_tensor_work(a):
    b = a * 2
    print(end="")
    return b


@cases((A,))
def nested_break_then_exception_caught(a):
    try:
        _level1(a)
        raise KeyError("k")
    except KeyError:
        return a + 7


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_graph_break_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)

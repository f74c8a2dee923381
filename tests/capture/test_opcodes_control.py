"""Control flow on Python values: if/elif/else, for/while, break/continue, ternaries, and/or, nested loops.

Branches on constants, shapes and Python flags are decided at capture time, so each
function is one graph.
"""
import pytest
import torch

from support.capture import check, t


def if_on_shape(x):
    if x.shape[0] > 2:
        return x * 2
    return x - 1


def if_elif_else(x, mode):
    if mode == "a":
        y = x + 1
    elif mode == "b":
        y = x * 3
    else:
        y = x.neg()
    return y


def ternary(x, flag):
    return x.sin() if flag else x.cos()


def for_range(x):
    for i in range(4):
        x = x + i
    return x * 0.5


def for_range_step(x):
    acc = x
    for i in range(10, 0, -3):
        acc = acc * 0.5 + i
    return acc


def while_counter(x):
    i = 0
    while i < 5:
        x = x * 1.1
        i += 1
    return x * 0.5


def loop_break(x):
    for i in range(10):
        if i == 3:
            break
        x = x + 1
    return x * 0.5


def loop_continue(x):
    for i in range(6):
        if i % 2:
            continue
        x = x * 2
    return x * 0.5


def nested_loops(x):
    for i in range(3):
        for j in range(2):
            x = x + i * j
    return x * 0.5


def while_else(x):
    n = 0
    while n < 3:
        n += 1
    else:
        x = x + n
    return x * 0.5


def for_else(x):
    for i in range(3):
        if i == 10:
            break
    else:
        x = x - 1
    return x * 0.5


def and_or(x, a, b):
    c = a and b
    d = a or b
    if c or not d:
        return x + 1
    return x - 1


def chained_compare(x):
    n = x.shape[0]
    if 0 < n <= 4 < 10:
        return x * n
    return x - 0.5


def is_none_branch(x, y=None):
    if y is None:
        y = torch.ones_like(x)
    return x + y


def is_not_none_branch(x, y):
    if y is not None:
        return x + y
    return x * 3


def loop_over_list_of_tensors(xs):
    total = xs[0]
    for t_ in xs[1:]:
        total = total + t_
    return total


def loop_over_tensor_rows(x):
    out = []
    for row in x:
        out.append(row.sum())
    return torch.stack(out)


def early_return_in_loop(x):
    for i in range(5):
        x = x + 1
        if i == 2:
            return x
    return x * 100


def nested_function_in_loop(x):
    fns = []
    for k in range(3):
        fns.append(lambda v, k=k: v * k)
    return sum(f(x) for f in fns)


def loop_dim_reduction(x):
    while x.dim() > 1:
        x = x.sum(0)
    return x * 0.5


def not_operator(x, flag):
    if not flag:
        return x.exp()
    return x.log1p()


def bool_of_int(x, n):
    if n:
        return x + n
    return x * 0.5


def in_membership(x, mode):
    if mode in ("relu", "gelu"):
        return torch.relu(x)
    if mode not in {"tanh"}:
        return x.abs()
    return torch.tanh(x)


def assert_on_constant(x):
    assert x.dim() == 2, "wants 2-d"
    return x + 1


CASES = [
    (if_on_shape, (t(3, 4),)),
    (if_on_shape, (t(2, 4),)),
    (if_elif_else, (t(3), "a")),
    (if_elif_else, (t(3), "b")),
    (if_elif_else, (t(3), "c")),
    (ternary, (t(3), True)),
    (ternary, (t(3), False)),
    (for_range, (t(3, grad=True),)),
    (for_range_step, (t(3, grad=True),)),
    (while_counter, (t(3, grad=True),)),
    (loop_break, (t(3),)),
    (loop_continue, (t(3),)),
    (nested_loops, (t(3),)),
    (while_else, (t(2),)),
    (for_else, (t(2),)),
    (and_or, (t(2), True, False)),
    (and_or, (t(2), 0, 0)),
    (and_or, (t(2), 1, 2)),
    (chained_compare, (t(3),)),
    (chained_compare, (t(7),)),
    (is_none_branch, (t(3),)),
    (is_none_branch, (t(3), t(3))),
    (is_not_none_branch, (t(3), None)),
    (is_not_none_branch, (t(3), t(3, grad=True))),
    (loop_over_list_of_tensors, ([t(2), t(2), t(2)],)),
    (loop_over_tensor_rows, (t(4, 3, grad=True),)),
    (early_return_in_loop, (t(3),)),
    (nested_function_in_loop, (t(3, grad=True),)),
    (loop_dim_reduction, (t(2, 3, 4),)),
    (not_operator, (t(3), False)),
    (not_operator, (t(3).abs(), True)),
    (bool_of_int, (t(3), 0)),
    (bool_of_int, (t(3), 4)),
    (in_membership, (t(3), "relu")),
    (in_membership, (t(3), "tanh")),
    (in_membership, (t(3), "none")),
    (assert_on_constant, (t(2, 2),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_control_flow_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True)

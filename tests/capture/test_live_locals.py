"""A graph break passes the continuation only the locals the rest of the function may read.

A local the function never reads again is no output of the graph before the break: it would be kept alive for
nothing and, requiring grad, be one more edge of the graph's autograd node, which a backward through another
output then walks into (fuzz seed 412468: `relu`'s saved result, written in place, raised in kiln's backward and
not in eager's, which never reaches it). torch.compile's continuations take the live locals too. A function that
may read its locals by name (`locals()`, `eval`, `super()`) keeps them all.
"""
import torch

import kiln
from kiln.capture import bytecode
from support.capture import check


def outputs_of_graphs(fn, *args) -> list[int]:
    """The number of outputs of each graph kiln captures from `fn(*args)`."""
    counts = []

    def backend(gm, example_inputs):
        counts.append(len(next(iter(gm.graph.find_nodes(op="output"))).args[0]))
        return gm

    kiln.compile(fn, backend=backend)(*args)
    return counts


def dead_after_the_break(x):
    a = x.sin()
    b = a * 2  # read before the break only
    c = b + 1
    kiln.graph_break()
    return c * 3


def read_in_the_next_iteration(x):
    total = x * 0
    for i in range(3):
        kiln.graph_break()
        total = total + x * i  # total and x are read after every break
    return total


def read_by_name(x):
    a = x.sin()
    b = a * 2
    kiln.graph_break()
    return locals()["b"] + 1


def test_the_graph_before_a_break_returns_only_what_is_read_after_it():
    assert outputs_of_graphs(dead_after_the_break, torch.randn(3))[0] == 1


def test_locals_read_again_in_a_loop_stay_live():
    check(read_in_the_next_iteration, torch.randn(3))


def test_a_function_reading_its_locals_by_name_keeps_them_all():
    check(read_by_name, torch.randn(3))
    assert outputs_of_graphs(read_by_name, torch.randn(3))[0] >= 2


def test_liveness_follows_jumps_and_writes():
    def branchy(x, flag):
        y = x + 1
        if flag:
            z = y * 2
        else:
            z = x
        del y
        return z

    code = branchy.__code__
    first = bytecode.instructions(code)[0].index
    assert bytecode.live_locals(code, first) == {"x", "flag"}
    stores = [i.index for i in bytecode.instructions(code) if i.opname == "STORE_FAST" and i.argval == "z"]
    # past the first store of z, y is still deleted below (a DELETE_FAST reads nothing), z is returned
    assert bytecode.live_locals(code, stores[0] + 1) == {"z"}


def relu_written_then_unused(b, d):
    t0 = b * 1.5 + 0.5
    t1 = torch.relu(d)  # saves its result
    t1[:0].add_(1)  # an empty write counts as a write: relu's backward would raise
    t3 = t1 * 1.5 + 0.5
    p3 = t3 * t3
    kiln.graph_break()
    t3 = t3 + p3
    t5 = t0 * 1.5 + 0.5
    kiln.graph_break()
    return t5


def test_a_backward_through_one_output_does_not_walk_into_a_dead_locals_history():
    grads = []
    for fn in (relu_written_then_unused, kiln.compile(relu_written_then_unused, backend="aot_eager")):
        b = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        d = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_()
        fn(b, d).sum().backward()
        grads.append((b.grad, d.grad))
    torch.testing.assert_close(grads[1], grads[0])

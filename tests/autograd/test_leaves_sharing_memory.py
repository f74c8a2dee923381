"""Leaves that require grad and share memory, written in place where no gradient is recorded (`no_grad`, as
`torch.nn.init` writes). Eager gives each leaf a gradient of its own shape, one value per element, whatever memory
its elements share: an expanded leaf's two rows that are one row of memory get two gradients, and two leaves that
are windows of one vector get one each. Compiled with one base input per storage, the gradient reached the
storage: each shared element got the mean of its positions' gradients (inf and -inf gave NaN), and the second leaf
none. Such graphs now run as captured, with eager's gradients; where the graph gives the leaf no gradient, they
compile (the leaf is then a view of the base's detached alias).
"""
from __future__ import annotations

import pytest
import torch

from support.differential import check

RUNS_OP_BY_OP = ("graph: a leaf that requires grad on a written shared storage runs op "
                 "by op (aliased_inputs.py)")

BACKENDS = ["aot_eager", "inductor"]


def zero_a_column_then_scale(c):
    """Each position scaled by its own weight: the rows that share memory get different gradients."""
    torch.nn.init.zeros_(c[..., :1])
    return c * torch.arange(12.0).reshape(2, 6)


def expanded_leaf(call):
    return [torch.linspace(-1.0, 2.0, 6).reshape(1, 6).expand(2, 6).requires_grad_()]


@pytest.mark.allows_fallback(RUNS_OP_BY_OP)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_expanded_leaf_written_under_no_grad_gets_a_gradient_per_element(backend):
    check(zero_a_column_then_scale, expanded_leaf, backend, calls=2)


def zero_an_element_then_add(a, b):
    with torch.no_grad():
        a[4].zero_()
    return a * 2 + b[:5] * 3


def two_leaves_on_one_vector(call):
    vector = torch.linspace(-1.0, 2.0, 8)
    return [vector[:5].requires_grad_(), vector[3:].requires_grad_()]


@pytest.mark.allows_fallback(RUNS_OP_BY_OP)
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_leaves_on_one_storage_get_their_own_gradients(backend):
    check(zero_an_element_then_add, two_leaves_on_one_vector, backend, calls=2)


def exp_of_scaled(c):
    torch.nn.init.zeros_(c[..., :1])
    return (c * torch.tensor([[40.0], [-40.0]])).exp()


def leaf_whose_gradients_overflow(call):
    return [torch.tensor([[3.0, -3.0]]).expand(2, 2).requires_grad_()]


@pytest.mark.allows_fallback(RUNS_OP_BY_OP)
@pytest.mark.parametrize("backend", BACKENDS)
def test_infinite_gradients_of_shared_elements_stay_apart(backend):
    """As the fuzzer's seed 401093: one row's gradient overflows to inf, the other's is -0 (there, inf and -inf:
    their mean was NaN)."""
    check(exp_of_scaled, leaf_whose_gradients_overflow, backend)


def zero_a_column_then_return_it(c):
    """Fuzz seed 304212: the leaf is written and returned, and no gradient of the graph reaches it."""
    torch.nn.init.zeros_(c[..., :1])
    return c, c.detach() * 2


def zero_an_element_then_read_the_other(a, b):
    with torch.no_grad():
        a[4].zero_()
    return b[:5] * 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program,inputs", [(zero_a_column_then_return_it, expanded_leaf),
                                            (zero_an_element_then_read_the_other, two_leaves_on_one_vector)],
                         ids=["an expanded leaf", "the first of two leaves"])
def test_a_written_leaf_the_graph_gives_no_gradient_compiles(program, inputs, backend):
    """No base can carry such a leaf's gradient, but the graph gives it none: it is held as a view of the detached
    base, which reads and writes its memory as eager does (no fallback: tests run strict)."""
    check(program, inputs, backend, calls=2)

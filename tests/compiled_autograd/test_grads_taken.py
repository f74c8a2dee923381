"""The grads a compiled backward assigns to leaves follow AccumulateGrad's rules: a grad no one else holds is
taken as it is (a bias grad computed as a [1, n] sum is not copied again), one whose storage something else
holds (another leaf's grad, an input of the graph) is copied, so that accumulating into one leaf's grad in
place never changes another's. Each case runs two backwards (the second accumulates) eagerly and compiled."""
import contextlib

import pytest
import torch

import kiln


def linear_with_bias(a, b):
    return (a.unsqueeze(0) * torch.ones(3, 1) + b).sum()  # b's grad: a column sum over a [3, n] buffer


def shared_incoming_grad(a, b):
    return (a + b).sum()  # both leaves receive the same grad


def concatenated(a, b):
    return (torch.cat([a, b]) * 2).sum()  # the grads are halves of one buffer


def same_leaf_twice(a, b):
    return (a * a + b).sum()


CASES = [linear_with_bias, shared_incoming_grad, concatenated, same_leaf_twice]


def backward_twice(fn, leaves, context):
    with context:
        fn(*leaves).backward()
        (leaves[0] * 3).sum().backward()  # accumulates into the first leaf's grad, in place where it can
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_grads_match_eager_and_each_leaf_owns_its_grad(fn):
    def leaves():
        torch.manual_seed(0)
        return [torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)]

    expected = backward_twice(fn, leaves(), contextlib.nullcontext())
    got = backward_twice(fn, leaves(), kiln.compiled_autograd.enable(lambda gm: kiln.compile(gm, fullgraph=True)))
    torch.testing.assert_close(got, expected)
    pointers = [g.untyped_storage().data_ptr() for g in got]
    assert len(set(pointers)) == len(pointers), "two leaves' grads share a storage"
    for g in got:
        assert g.untyped_storage().nbytes() == g.numel() * g.element_size(), "a grad keeps a larger buffer alive"

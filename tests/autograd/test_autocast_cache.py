"""A tensor used several times under autocast gets eager's gradient, bit for bit.

Eager's autocast casts a float32 leaf that requires grad (and is no view) once per autocast region, so the
gradients of its uses are summed in bf16 before the cast's backward makes them float32; a non-leaf or a view is
cast at each use and its gradients are summed in float32. The compiled graphs do the same for each kind of
input, under the AOT backend (the graphs) and under kiln's code generator, for autocast entered inside the
compiled function or active around the call.
"""
import contextlib

import pytest
import torch
import torch.nn as nn

import kiln

BACKENDS = ["aot_eager", "inductor"]


def squared(b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return (b @ b).float()


def weight_read_twice(h, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = h @ w + 3 * (h @ w).relu()
    return y.float()


def without_cache(b):
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        return (b @ b).float()


def leaf(seed: int, shape=(9, 9)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def non_leaf(seed: int, shape=(9, 9)) -> torch.Tensor:
    return leaf(seed, shape) * 1


def leaf_view(seed: int, shape=(9, 9)) -> torch.Tensor:
    """A leaf that views a larger tensor: eager's cache passes it by."""
    rows, cols = shape
    return torch.randn(rows, cols + 1, generator=torch.Generator().manual_seed(seed))[:, :cols].requires_grad_()


def grads(fn, make_inputs, seed: int, around=contextlib.nullcontext) -> list[torch.Tensor]:
    """The inputs' gradients of `fn(*inputs).sum()`; for a non-leaf input, its leaf's."""
    inputs = [make(seed + k) for k, make in enumerate(make_inputs)]
    with around():
        out = fn(*inputs)
    leaves = [t if t.is_leaf else t.grad_fn.next_functions[0][0].variable for t in inputs]
    out.sum().backward()
    return [t.grad for t in leaves]


def assert_eager_grads(fn, make_inputs, backend, around=contextlib.nullcontext):
    compiled = kiln.compile(fn, backend=backend)
    for seed in range(0, 40, 4):  # the sums round differently in some element of most of these seeds
        expected = grads(fn, make_inputs, seed, around)
        actual = grads(compiled, make_inputs, seed, around)
        for e, a in zip(expected, actual):
            assert torch.equal(e, a), f"seed {seed}: largest difference {(e - a).abs().max().item()}"


@pytest.mark.sampled(every=2, classes=("make",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [leaf, non_leaf, leaf_view], ids=["leaf", "non_leaf", "leaf_view"])
def test_an_input_cast_for_two_operands(backend, make):
    """`b @ b`: a leaf's one bf16 cast receives both operands' gradients and sums them in bf16; a non-leaf's or a
    view's two casts each give a float32 gradient, summed in float32."""
    assert_eager_grads(squared, [make], backend)


def squared_after_a_write(b):
    torch.nn.init.zeros_(b[..., :1])  # under no_grad: b stays a leaf, which eager's cache still holds
    return squared(b)


@pytest.mark.sampled(every=2, classes=("make",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [leaf, non_leaf], ids=["leaf", "non_leaf"])
def test_an_input_written_then_cast_for_two_operands(backend, make):
    """The graph writes the input before casting it: it traces a copy of the input it writes, which the cache held
    only as a leaf of its own (fuzz seed 500563: the copy was cast twice, the gradients summed in float32 where
    eager's one cast of the written leaf sums them in bf16)."""
    assert_eager_grads(squared_after_a_write, [make], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_leaf_weight_and_a_non_leaf_activation_in_one_graph(backend):
    """The weight's uses share one cast (bf16 sum), the activation's do not (float32 sum), in the same graph."""
    assert_eager_grads(weight_read_twice, [non_leaf, leaf], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_active_around_the_call(backend):
    """Autocast entered by the caller: the region, and so the cache, spans the compiled graph."""
    assert_eager_grads(lambda b: (b @ b).float(), [leaf], backend,
                       around=lambda: torch.autocast("cpu", dtype=torch.bfloat16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_region_with_the_cache_off(backend):
    """`cache_enabled=False`: every use casts again, in eager and in the graphs."""
    assert_eager_grads(without_cache, [leaf], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_module_weight_applied_in_a_loop(backend):
    """A recurrent cell's weight, read at every step under autocast: its gradient sums the steps' in bf16."""
    torch.manual_seed(0)
    cell = nn.Linear(8, 8)
    compiled_cell = nn.Linear(8, 8)
    compiled_cell.load_state_dict(cell.state_dict())

    def unrolled(module, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(3):
                x = torch.tanh(module(x))
        return x.float()

    compiled = kiln.compile(unrolled, backend=backend)
    x = torch.randn(4, 8)
    unrolled(cell, x).sum().backward()
    compiled(compiled_cell, x).sum().backward()
    assert torch.equal(cell.weight.grad, compiled_cell.weight.grad)
    assert torch.equal(cell.bias.grad, compiled_cell.bias.grad)


def test_a_leaf_and_a_non_leaf_call_run_variants_of_their_own():
    """Whether eager's cache holds an input is part of the variant a call runs: a non-leaf after a leaf does not
    run the leaf's graphs (whose gradients would be summed in bf16)."""
    compiled = kiln.compile(squared, backend="aot_eager")
    for make in (leaf, non_leaf):
        expected = grads(squared, [make], 8)
        assert torch.equal(grads(compiled, [make], 8)[0], expected[0])

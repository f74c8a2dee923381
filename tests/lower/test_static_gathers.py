"""Gathers whose index is computed from positions alone are plain loads (kiln/lower/ops/indexing.py).

`torch.roll` reads `index_select(x, d, fmod(arange(n) + start, n))`: an index with no tensor behind it, which
the lowering turns into a direct load at `Mod(i + start, n)`, with no per-element index computation and no
range check (Swin's shifted windows roll every activation twice a block). An index that is not provably in
range keeps its check, and raises what eager raises.
"""
from __future__ import annotations

import pytest
import torch

from kiln.lower import ir, lower_graph
from support.lowering import check, check_triton, compile_fn, trace


def indirect_loads(fn, *inputs) -> list:
    graph = lower_graph(trace(fn, *inputs), list(inputs))
    return [ld for n in graph.nodes if isinstance(n, ir.ComputedBuffer) for ld in ir.loads(n.data.body)
            if ld.indirect]


ROLLS = {
    "one_dim": lambda x: torch.roll(x, 3, dims=1) * 2,
    "negative_shift": lambda x: torch.roll(x, -2, dims=2) + 1,
    "two_dims": lambda x: torch.roll(x, (-3, 3), dims=(1, 2)),
    "shift_past_size": lambda x: torch.roll(x, 13, dims=1).relu(),
    "of_a_computed_value": lambda x: torch.roll(x.sin() * 3, (1, -1), dims=(1, 2)).sum(-1),
    "flattened": lambda x: torch.roll(x, 5) - x,
    "window_partition_after_roll": lambda x: torch.roll(x, (-2, -2), dims=(1, 2)).view(2, 2, 4, 2, 4, 3)
    .permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, 3),
}


@pytest.mark.parametrize("name", ROLLS)
def test_a_roll_is_a_direct_load(name):
    x = torch.randn(2, 8, 8, 3)
    assert indirect_loads(ROLLS[name], x) == []
    check(ROLLS[name], x)


def test_a_roll_on_the_triton_target():
    check_triton(ROLLS["two_dims"], torch.randn(2, 8, 8, 3))


def test_a_modular_index_select_is_a_direct_load():
    """The same rule for the pattern written out: a cyclic shift and a period of a smaller dim."""
    def fn(x):
        n = x.shape[1]
        shifted = x.index_select(1, torch.fmod(torch.arange(n) + 5, n))
        return shifted + x[:, torch.arange(n) % 4]
    x = torch.randn(3, 8)
    assert indirect_loads(fn, x) == []
    check(fn, x)


def test_an_index_not_provably_in_range_keeps_its_check():
    """`arange(n) + 1` leaves the dim at its last position: the check stays, and eager's error is raised."""
    def fn(x):
        return x[:, torch.arange(x.shape[1]) + 1]
    x = torch.randn(3, 8)
    with pytest.raises(IndexError):
        fn(x)
    compiled = compile_fn(fn, x, mode="fake")
    with pytest.raises(IndexError):
        compiled(x)


def test_a_position_index_with_no_modulo_keeps_its_check_and_its_values():
    def fn(x):
        return x[:, torch.arange(x.shape[1]) * 1]
    x = torch.randn(3, 8)
    assert len(indirect_loads(fn, x)) == 1
    check(fn, x)


def test_an_index_read_from_a_tensor_stays_indirect():
    def fn(x, idx):
        return torch.roll(x, 1, dims=1)[:, idx]
    x, idx = torch.randn(3, 8), torch.tensor([7, 0, 3])
    assert len(indirect_loads(fn, x, idx)) == 1
    check(fn, x, idx)


def test_a_roll_of_a_dynamic_size():
    """With the rolled dim's size a symbol the index is `fmod(arange(s) + start, s)`, `start` itself computed
    from `s`: kiln cannot prove it in range, keeps the checked gather, and returns eager's values."""
    fn = ROLLS["one_dim"]
    compiled = compile_fn(fn, torch.randn(2, 8, 5, 3), mode="symbolic")
    for n in (8, 11):
        y = torch.randn(2, n, 5, 3)
        (got,) = compiled(y)
        torch.testing.assert_close(got, fn(y))


def test_a_constant_index_into_a_dynamic_size_keeps_its_check():
    """A constant position (a filled index tensor) into a dim whose size is a symbol: in range for one size,
    not for all, so it stays checked."""
    def fn(x):
        return x.index_select(1, torch.full((2,), 4, dtype=torch.int64)) * 2
    compiled = compile_fn(fn, torch.randn(3, 8), mode="symbolic")
    (got,) = compiled(torch.randn(3, 6)[:, :6].contiguous())
    assert got.shape == (3, 2)
    x = torch.randn(3, 5)
    (got,) = compiled(x)
    torch.testing.assert_close(got, fn(x))
    with pytest.raises(IndexError):
        compiled(torch.randn(3, 4))

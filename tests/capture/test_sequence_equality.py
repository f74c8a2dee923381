"""`==` and `!=` between sequences that hold symbolic sizes (kiln/capture/values/operators.py).

A torch.Size constant compared with a tuple of symbols (`torch.Size([]) == (n,)`, torch's
`linear_cross_entropy` checks its target's shape so) broke the graph: the constant was not read as a sequence.
A list and a tuple with equal items compared equal, where Python says they never are. Strict, dynamic sizes,
eager's results.
"""
from __future__ import annotations

import pytest
import torch

import kiln

CASES = {  # (x of a dynamic length, a 0-d target) -> a bool of eager's
    "target_shape_vs_symbol_tuple": lambda x, t: t.shape == (x.shape[0],),  # a 0-d input's shape is a constant
    "target_shape_vs_unpacked_tuple": lambda x, t: t.shape == (*x.shape[:0], x.shape[0]),
    "empty_size_vs_symbol_tuple": lambda x, t: torch.Size([]) == (x.shape[0],),
    "size_vs_symbol_tuple": lambda x, t: torch.Size([3]) == (x.shape[0],),
    "size_ne_symbol_tuple": lambda x, t: torch.Size([3]) != (x.shape[0],),
    "symbol_tuple_vs_size": lambda x, t: (x.shape[0], 2) == torch.Size([4, 2]),
    "list_vs_tuple": lambda x, t: [x.shape[0]] == (x.shape[0],),
    "list_ne_tuple": lambda x, t: [x.shape[0]] != (x.shape[0],),
    "shape_vs_tuple": lambda x, t: x.shape == (x.shape[0],),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sequence_equality_with_symbols_is_pythons(name):
    predicate = CASES[name]

    def fn(x, target):
        return x * 2 if predicate(x, target) else x - 1

    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for n in (3, 4, 5):
        x, target = torch.randn(n), torch.tensor(1)
        torch.testing.assert_close(compiled(x, target), fn(x, target))

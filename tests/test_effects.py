"""Dead-code elimination keeps an op that runs for its check or its write, whatever torch's version judges.

torch 2.11 calls `_linalg_check_errors` pure: its own `eliminate_dead_code` dropped the check, and a singular
solve compiled by kiln returned numbers where eager raises. Here torch's judgement is patched to "pure" for
every node, as the least generous version would give, and kiln's rule must still keep the checks and writes.
"""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.effects import eliminate_dead_code, has_effect

aten = torch.ops.aten


def solve_then_scale(a, b, buffer):
    x = torch.linalg.solve(a, b)  # _linalg_solve_ex, then _linalg_check_errors on its info
    buffer.add_(1)  # a write nothing reads afterwards
    unused = a * 3  # dead
    del unused
    return x * 2


@pytest.fixture
def torch_says_pure(monkeypatch):
    monkeypatch.setattr(torch.fx.Node, "is_impure", lambda self, *a, **k: self.op in ("placeholder", "output"))


def traced():
    a, b = torch.randn(3, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    return make_fx(solve_then_scale)(a, b, torch.zeros(2))


def targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def test_checks_and_writes_survive_where_torch_calls_them_pure(torch_says_pure):
    gm = traced()
    assert eliminate_dead_code(gm.graph)
    kept = targets(gm)
    assert aten._linalg_check_errors.default in kept
    assert aten.add_.Tensor in kept
    assert aten.mul.Tensor in kept  # x * 2 is returned
    assert sum(n.target is aten.mul.Tensor for n in gm.graph.nodes) == 1  # a * 3 is gone


def test_torchs_own_elimination_would_drop_the_check_under_that_judgement(torch_says_pure):
    """The premise: without kiln's rule the check goes, which is how a singular solve stopped raising."""
    gm = traced()
    gm.graph.eliminate_dead_code()
    assert aten._linalg_check_errors.default not in targets(gm)


def test_an_op_returning_nothing_has_an_effect(torch_says_pure):
    check = next(n for n in traced().graph.nodes if n.target is aten._linalg_check_errors.default)
    assert has_effect(check)

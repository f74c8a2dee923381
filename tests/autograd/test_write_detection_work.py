"""Which graphs pay for a fake run that finds the inputs they write (kiln/autograd/aliased_inputs.py).

A write through a view whose elements share memory (`a.expand(3, n)[1].add_(x)`) needs the written input to
become a view of a base. Finding such writes takes one more run of the whole graph on fake tensors, so a cheap
look at the calls decides first: only a graph that calls an overlapping view op (`expand`) and an in-place op
pays for it. Python's `&`, `|` and `not` (`operator.and_`, `or_`, `not_`) are named like in-place ops but write
nothing: an attention mask combined with `&` beside an `expand` (GPT-2's forward) made every such graph pay.
Eager and kiln side by side, and the fake runs counted.
"""
from __future__ import annotations

import pytest
import torch

from kiln.autograd import aliased_inputs
from support.differential import check

BACKENDS = ["aot_eager", "inductor"]


def masks_combined_with_and(x, keep):
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    mask = causal.expand(x.shape[0], 4, 4) & keep.expand(x.shape[0], 4, 4)
    return x.masked_fill(~mask, -1.0).softmax(-1)


def masks_combined_with_or(x, keep):
    mask = keep.expand(x.shape[0], 4, 4) | (x > 0)
    return torch.where(mask, x, x * 0.5)


def an_input_row_written_beside_an_expand(x, keep):
    x[0].add_(1.0)
    return x.sum(0).expand(3, 4, 4) * (keep & (x > 0))


def _arguments(call):
    x = torch.linspace(-2.0, 2.0, 3 * 16).reshape(3, 4, 4) + call
    return [x, (torch.arange(16).reshape(1, 4, 4) + call) % 3 != 0]


def _fake_runs(program, backend, monkeypatch) -> int:
    """Fake runs for write detection while compiling and checking `program` against eager."""
    runs = [0]
    original = aliased_inputs._input_writes

    def counted(*args):
        runs[0] += 1
        return original(*args)

    with monkeypatch.context() as m:
        m.setattr(aliased_inputs, "_input_writes", counted)
        check(program, _arguments, backend)
    return runs[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [masks_combined_with_and, masks_combined_with_or], ids=lambda f: f.__name__)
def test_operators_named_like_writes_cost_no_fake_run(program, backend, monkeypatch):
    assert _fake_runs(program, backend, monkeypatch) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_of_an_input_beside_an_expand_is_still_looked_for(backend, monkeypatch):
    """(A write into a tensor the graph made costs no run: tests/autograd/test_overlap_write_check.py.)"""
    assert _fake_runs(an_input_row_written_beside_an_expand, backend, monkeypatch) == 1

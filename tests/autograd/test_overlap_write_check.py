"""Which graphs pay for a fake run to find their writes through an expanded view (aliased_inputs.py).

A graph that expands an input and writes in place may write the input through the expanded view
(`x.expand(3, n)[1].copy_(v)`), which needs the input to become a view of a base. Finding out runs the whole
captured graph on fake tensors, in a cold and in a warm process alike, so only graphs that call both an
overlapping view op and an in-place op pay for it. Python's operators are in place only as `x op= y` and
`x[i] = y`: `m & k` (`operator.and_`, a transformer's attention mask) is not, and costs no run. Each program
runs in eager and kiln side by side.
"""
import pytest
import torch

from kiln.autograd import aliased_inputs
from support.differential import check


def mask_and(x, v):
    keep = (x > 0) & (v > 0)  # operator.and_
    return x.expand(3, 4) * keep


def mask_or_not(x, v):
    keep = (x > 0) | ~(v > 0)  # operator.or_, operator.invert
    return torch.where(keep, x.expand(3, 4), 0.0)


def is_none_check(x, v):
    bias = None
    scale = 2.0 if bias is None else 1.0  # operator.is_ where the capture keeps it
    return x.expand(2, 4) * v * scale


def copy_into_an_expanded_row(x, v):
    x.expand(3, 4)[1].copy_(v)
    return x * 2


def add_assign_into_an_expanded_row(x, v):
    row = x.expand(3, 4)[1]
    row += v  # operator.iadd
    return x * 2


def assign_into_an_expanded_row(x, v):
    x.expand(3, 4)[1][:] = v  # operator.setitem
    return x + 1


def add_into_an_expanded_row(x, v):
    x.expand(3, 4)[2].add_(v)
    return x.sum()


def decoder_input_beside_an_expand(x, v):
    """transformers' `shift_tokens_right` beside an expanded mask: every write is into a tensor the graph made."""
    shifted = x.new_zeros(2, 4)
    shifted[:, 1:] = x[:, :-1].expand(2, 3)
    shifted[:, 0] = 2
    shifted.masked_fill_(shifted > 0.5, 0.25)
    return x.expand(2, 4) * shifted + v


def mask_filled_in_place(x, v):
    keep = (x.expand(3, 4) > 0).float()
    keep.mul_(2)
    keep += v
    return keep


NOT_IN_PLACE = [mask_and, mask_or_not, is_none_check]
WRITES_OF_ITS_OWN = [decoder_input_beside_an_expand, mask_filled_in_place]
IN_PLACE = [copy_into_an_expanded_row, add_assign_into_an_expanded_row, assign_into_an_expanded_row,
            add_into_an_expanded_row]


def _arguments(call):
    return [torch.linspace(-1.0, 1.0, 4).reshape(1, 4) + call, torch.linspace(1.0, -0.5, 4)]


@pytest.fixture
def fake_runs(monkeypatch):
    """The fake runs `_input_writes` makes, counted."""
    runs = []
    original = aliased_inputs._input_writes
    monkeypatch.setattr(aliased_inputs, "_input_writes", lambda *args: runs.append(1) or original(*args))
    return runs


@pytest.mark.parametrize("program", NOT_IN_PLACE, ids=lambda f: f.__name__)
def test_operators_that_are_not_in_place_cost_no_fake_run(program, fake_runs):
    check(program, _arguments, "aot_eager", calls=2)
    assert fake_runs == []


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", WRITES_OF_ITS_OWN, ids=lambda f: f.__name__)
def test_writes_into_tensors_the_graph_made_cost_no_fake_run(program, backend, fake_runs, monkeypatch):
    """In-place ops beside an expand that write only tensors the graph made cannot write an input: no fake run,
    neither here nor for the graph's independent parts (graph_parts.py)."""
    from kiln.autograd import graph_parts
    parts_runs = []
    original = graph_parts._effects
    monkeypatch.setattr(graph_parts, "_effects", lambda *args: parts_runs.append(1) or original(*args))
    check(program, _arguments, backend, calls=2)
    assert fake_runs == [] and parts_runs == []


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", IN_PLACE, ids=lambda f: f.__name__)
def test_writes_through_an_expanded_view_are_found_and_kept(program, backend, fake_runs):
    check(program, _arguments, backend, calls=2)
    assert fake_runs, "an in-place op next to an expand is looked at"

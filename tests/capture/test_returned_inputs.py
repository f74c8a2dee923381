"""Dropout that does nothing returns its input object, as eager's does (kiln/capture/values/returned_inputs.py).

ATen's dropout returns its input itself when `p == 0`, when not training, or when the input has no elements; with
symbolic sizes the capture's fake run went through torch's Python decomposition, which returns a copy, so `y is x`
held in eager and not in kiln (fuzz seed 301245: an empty view through dropout in training, returned beside the
view). Each function of the family, eager's conditions and the ones where eager makes a new tensor, static and
dynamic sizes, under every backend.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln

BACKENDS = ["eager", "aot_eager", "inductor"]
# (function, its training flag's keyword, the rank of the input it takes)
FAMILY = {
    "dropout": (F.dropout, "training", 2),
    "alpha_dropout": (F.alpha_dropout, "training", 2),
    "feature_alpha_dropout": (F.feature_alpha_dropout, "training", 3),
    "dropout1d": (F.dropout1d, "training", 3),
    "dropout2d": (F.dropout2d, "training", 4),
    "dropout3d": (F.dropout3d, "training", 5),
    "torch.dropout": (torch.dropout, "train", 2),
}
# (p, training, whether the input is empty): eager returns the input for the first three
CASES = {"not training": (0.5, False, False), "p is 0": (0.0, True, False), "no elements": (0.5, True, True),
         "p is 1": (1.0, True, False)}


def results(fn, flag: str, p: float, training: bool):
    def dropped(x):
        t = x * 2
        return fn(t, p, **{flag: training}), t
    return dropped


@pytest.mark.sampled(every=3, classes=("name", "case"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(FAMILY))
def test_dropout_returns_its_input_where_eager_does(name, case, dynamic, backend):
    fn, flag, rank = FAMILY[name]
    p, training, empty = CASES[case]
    x = torch.randn(*[3] * (rank - 1), 0 if empty else 4)
    program = results(fn, flag, p, training)
    kiln.reset()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", UserWarning)  # dropout2d's warning about its input's rank
        expected = program(x)
        got = kiln.compile(program, backend=backend, dynamic=dynamic)(x)
    assert (got[0] is got[1]) == (expected[0] is expected[1])
    if p == 1:  # a new tensor of zeros
        assert not got[0].any()
    else:
        torch.testing.assert_close(got[0], expected[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_through_dropout_in_eval_mode_is_returned_itself(backend):
    """nn.Dropout in eval mode passes the module's input through: the caller gets its own tensor back."""
    module = torch.nn.Sequential(torch.nn.Dropout(0.3)).eval()
    x = torch.randn(4, 5, requires_grad=True)
    kiln.reset()
    assert kiln.compile(module, backend=backend, dynamic=True)(x) is x

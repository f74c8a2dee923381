"""Batch norm's running statistics, written in place in training mode, on inputs holding infinities.

Functionalization needs batch norm's in-place writes decomposed. torch's decomposition takes the batch mean
from var_mean, whose running (Welford) update gives nan for a column holding -inf and finite values, where
eager's CPU kernel divides a sum by the count and gives -inf: the running mean came out nan under aot_eager.
kiln now rewrites the op as its functional form (eager's kernel) plus copies into the statistics
(autograd/decompositions.py `_updating_statistics`). Found by the fuzzer (seed 100740). Each case compares the
output, the running statistics and the gradients with eager's.
"""
import copy

import pytest
import torch

import kiln

INF, NAN = float("inf"), float("nan")
INPUTS = {
    "minus_inf_beside_finite": [[-INF, 1.0, 2.0], [3.0, 4.0, 5.0], [0.5, -1.0, 2.0]],
    "plus_inf": [[INF, 1.0, 2.0], [3.0, INF, 5.0], [0.5, -1.0, 2.0]],
    "both_infinities": [[INF, 1.0, 2.0], [-INF, 4.0, 5.0], [0.5, -1.0, NAN]],
    "finite": [[0.1, 1.0, 2.0], [3.0, -4.0, 5.0], [0.5, -1.0, 2.0]],
}
MODULES = {
    "batchnorm1d": lambda: torch.nn.BatchNorm1d(3),
    "batchnorm1d_no_affine": lambda: torch.nn.BatchNorm1d(3, affine=False, momentum=0.3),
    "batchnorm2d": lambda: torch.nn.BatchNorm2d(3),
}


def batch(values, module_name):
    x = torch.tensor(values)
    return x.t().reshape(1, 3, 3, 1) if module_name == "batchnorm2d" else x


def run(module, fn, x, grad):
    x = x.clone().requires_grad_(grad)
    with torch.enable_grad() if grad else torch.no_grad():
        out = fn(x)
    grads = []
    if grad:
        out.nan_to_num(0.0, 0.0, 0.0).sum().backward()
        grads = [x.grad] + [p.grad for p in module.parameters()]
    return out, module.running_mean, module.running_var, grads


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("module_name", MODULES)
@pytest.mark.parametrize("values", INPUTS)
def test_running_statistics_match_eager(values, module_name, grad):
    torch.manual_seed(0)
    eager_module = MODULES[module_name]().train()
    kiln_module = copy.deepcopy(eager_module)
    x = batch(INPUTS[values], module_name)
    expected = run(eager_module, eager_module, x, grad)
    actual = run(kiln_module, kiln.compile(kiln_module, backend="aot_eager"), x, grad)
    for e, a in zip(expected[:3], actual[:3]):
        torch.testing.assert_close(a.detach(), e.detach(), equal_nan=True)
    for e, a in zip(expected[3], actual[3]):
        torch.testing.assert_close(a, e, equal_nan=True)


def test_eval_mode_and_untracked_statistics_still_compile():
    """Outside training, and without running statistics, nothing is written: torch's decomposition serves."""
    x = batch(INPUTS["finite"], "batchnorm1d")
    for module in (torch.nn.BatchNorm1d(3).eval(), torch.nn.BatchNorm1d(3, track_running_stats=False)):
        torch.testing.assert_close(kiln.compile(module, backend="aot_eager")(x), module(x))

"""Floats computed from symbolic sizes (SymFloat) in a graph's arithmetic, beside eager (kiln/lower/sym_floats.py).

With dynamic sizes BatchNorm's running variance scales by `n / (n - 1)`, `var`'s and `std`'s backward by
`1 / (n - 1)`, and user code computes scales from shapes. kiln compiled none of these graphs (each ran through
ATen: 'result of type SymFloat cannot be an extern'), and a SymFloat `alpha` in a graph that needs a backward
crashed the partition. Each case runs at three sizes under KILN_STRICT=1 (no graph may fall back) and matches
eager's values, gradients and module state.
"""
from __future__ import annotations

import pytest
import torch

import kiln

CASES = {  # (x: (n, 3) float32 requiring grad, modules) -> a tensor
    "batch_norm_training": lambda x, m: m["bn"](x),
    "linear_batch_norm_loss": lambda x, m: torch.tanh(m["bn"](m["linear"](x))).square().mean(),
    "var_backward": lambda x, m: x.var(0),
    "std_backward": lambda x, m: x.std(),
    "std_over_rows": lambda x, m: x.std(1, keepdim=True) * x,
    "int_tensor_times_a_size_ratio": lambda x, m: (x > 0).long() * (x.shape[0] / (x.shape[0] - 1)) + x,
    "compare_with_a_size_ratio": lambda x, m: (x < x.shape[0] / 3).float() + x,
    "size_ratio_as_alpha": lambda x, m: torch.add(x, x.sin(), alpha=x.shape[0] / 2),
    "square_root_of_a_size": lambda x, m: x / (x.shape[0] ** 0.5),
}


def _modules() -> dict:
    torch.manual_seed(0)
    return {"bn": torch.nn.BatchNorm1d(3), "linear": torch.nn.Linear(3, 3, bias=False)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_float_of_the_sizes_compiles_and_matches_eager(name):
    fn = CASES[name]
    kiln.reset()
    eager_modules, kiln_modules = _modules(), _modules()
    compiled = kiln.compile(fn, dynamic=True)
    for n in (4, 6, 9):
        x = torch.randn(n, 3, generator=torch.Generator().manual_seed(n), requires_grad=True)
        x_kiln = x.detach().clone().requires_grad_()
        expected, got = fn(x, eager_modules), compiled(x_kiln, kiln_modules)
        torch.testing.assert_close(got, expected)
        expected.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(x_kiln.grad, x.grad)
    for key, value in eager_modules["bn"].state_dict().items():
        torch.testing.assert_close(kiln_modules["bn"].state_dict()[key], value)

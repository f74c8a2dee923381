"""Ops whose eager kernel checks the values it reads stay ATen's (lower/decompositions.py KEEP), beside eager.

`binary_cross_entropy` refuses an input outside [0, 1] and `bernoulli` a probability outside [0, 1]; their
decompositions (log and clamp, `rand_like(p) < p`) returned numbers. Kept whole, kiln's graph raises what
eager raises, used or not, and in range returns eager's values (bernoulli: the same draws for the same seed).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

PROGRAMS = {  # (x: (4, 3) in (0, 1), shift) -> a tensor; out of [0, 1] at shift 1.5
    "binary_cross_entropy": lambda x, shift: F.binary_cross_entropy(x + shift, torch.full((4, 3), 0.25)) * 2,
    "unused_binary_cross_entropy": lambda x, shift: (F.binary_cross_entropy(x + shift, x), x * 2)[1],
    "bernoulli_of_a_tensor": lambda x, shift: torch.bernoulli(x + shift) + 1,
}


def _outcome(fn, x, shift):
    torch.manual_seed(0)
    try:
        return fn(x, shift)
    except RuntimeError as e:
        return str(e).split("\n")[0]


@pytest.mark.parametrize("shift", [0.0, 1.5], ids=["in-range", "out-of-range"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_value_eager_checks_is_checked(name, shift):
    fn = PROGRAMS[name]
    x = torch.rand(4, 3, generator=torch.Generator().manual_seed(1)) * 0.9 + 0.05
    kiln.reset()
    expected, got = _outcome(fn, x, shift), _outcome(kiln.compile(fn, dynamic=False), x, shift)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got
    else:
        torch.testing.assert_close(got, expected)

"""numpy functions of Python numbers in a compiled region (CTRL scales embeddings by `np.sqrt(d_model)`).

Computed at capture time from the constant arguments (guarded like any constant), so the graph does not
break where torch.compile traces numpy; numpy on arrays or tensors still breaks.
"""
from __future__ import annotations

import numpy as np
import torch

import kiln
from kiln.api import context_of
from support.capture import check


def scale_by_numpy_sqrt(x, d_model):
    x = x * np.sqrt(d_model)
    x *= np.exp(0.5) + np.log1p(d_model)
    return x


def test_numpy_of_python_numbers_folds_into_one_graph():
    check(scale_by_numpy_sqrt, torch.randn(3), 64, graphs=1, fullgraph=True)


def test_a_new_number_recompiles():
    compiled = kiln.compile(scale_by_numpy_sqrt, backend="eager")
    x = torch.randn(3)
    for d_model in (64, 16, 64):
        torch.testing.assert_close(compiled(x, d_model), scale_by_numpy_sqrt(x, d_model))
    assert len(context_of(compiled).records) == 2

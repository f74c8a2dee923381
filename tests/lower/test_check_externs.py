"""An ATen op that returns nothing runs as an extern for its check: `_linalg_check_errors` raises on a failed
factorization. The whole graph fell back ("result of type NoneType cannot be an extern")."""
from __future__ import annotations

import pytest
import torch

import kiln


def inverse(a):
    return torch.linalg.inv_ex(a, check_errors=True)[0] * 2


def tensorsolve(a, b):
    return torch.linalg.tensorsolve(a, b)


def test_check_extern_runs_in_a_compiled_graph(compiled_graphs):
    a, b = torch.randn(6, 2, 3, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(kiln.compile(tensorsolve, fullgraph=True)(a, b), tensorsolve(a, b))
    assert "_linalg_check_errors" in compiled_graphs[0].artefacts["wrapper.py"]


def test_its_error_is_eagers():
    singular = torch.zeros(3, 2, 2, dtype=torch.float64)
    with pytest.raises(torch.linalg.LinAlgError, match="diagonal element 1 is zero"):
        kiln.compile(inverse, fullgraph=True)(singular)


def test_singular_tensorsolve_raises_eagers_error():
    a, b = torch.zeros(6, 2, 3, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    with pytest.raises(torch.linalg.LinAlgError):
        tensorsolve(a, b)
    with pytest.raises(torch.linalg.LinAlgError):
        kiln.compile(tensorsolve, fullgraph=True)(a, b)

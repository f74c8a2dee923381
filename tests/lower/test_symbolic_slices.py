"""Slices, selects and slice_scatters at a start that is an int argument made a symbol (`dynamic=True`).

A negative start counts from the end, so a start whose sign tracing left open was run through ATen. Its sign is
now decided at the call being compiled and kept as a guard (kiln/lower/graph.py `decide`): one graph serves every
start of that sign, the other sign compiles a second graph, and each is generated, strided slice_scatters from a
symbolic start included, with eager's values.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.lowering import count_externs

CASES = {  # (x: (12, 5), src: (12, 5), an int start) -> a tensor
    "slice": lambda x, src, n: x[n:] * 2,
    "select": lambda x, src, n: x.select(0, n).exp(),
    "slice_scatter": lambda x, src, n: torch.slice_scatter(x, src[: 12 - n % 12], 0, n),
    "slice_scatter_step_2": lambda x, src, n: torch.slice_scatter(x, src[: (12 - n % 12 + 1) // 2], 0, n, None, 2),
    "slice_scatter_step_3_dim_1": lambda x, src, n: torch.slice_scatter(x.t(), src.t()[:, : (12 - n % 12 + 2) // 3],
                                                                          1, n, None, 3).sin(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_symbolic_start_of_either_sign_is_generated(name, compiled_graphs):
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    g = torch.Generator().manual_seed(0)
    x, src = torch.randn(12, 5, generator=g), torch.randn(12, 5, generator=g)
    for n in (2, 3, 5, -9, -7):  # no slice of length 1 (a size 1 specializes)
        torch.testing.assert_close(compiled(x, src, n), fn(x, src, n))
    assert len(compiled_graphs) == 2, [g.artefacts["name"] for g in compiled_graphs]  # one per sign
    assert all(count_externs(g) == 0 for g in compiled_graphs), [str(g.artefacts["schedule"]) for g in compiled_graphs]

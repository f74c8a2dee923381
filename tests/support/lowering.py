"""Shared by the lower/schedule/codegen tests: trace to ATen, compile with kiln, compare with eager."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten

from kiln.lower.decompositions import decomposition_table
from kiln.pipeline import compile_aten_graph
from support.triton_device import DEVICE as TRITON_TEST_DEVICE
from support.triton_sm90 import assert_compiles_for_sm90, recording_builds


def trace(fn, *inputs, mode="real"):
    with torch.no_grad():
        return make_fx(fn, decomposition_table=decomposition_table(), tracing_mode=mode)(*inputs)


def compile_fn(fn, *inputs, mode="real", options=None):
    """kiln's compiled version of `fn` (a CompiledGraph); fails the test if kiln fell back to ATen."""
    gm = trace(fn, *inputs, mode=mode)
    compiled = compile_aten_graph(gm, list(inputs), options)
    assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
    return compiled


def assert_same(got, ref, dtype=None):
    got = tree_flatten(got)[0]
    ref = tree_flatten(ref)[0]
    assert len(got) == len(ref)
    for k, (g, r) in enumerate(zip(got, ref)):
        if not isinstance(r, torch.Tensor):
            assert g == r, k
            continue
        assert g.shape == r.shape, (k, g.shape, r.shape)
        assert g.dtype == r.dtype, (k, g.dtype, r.dtype)
        tol = {}
        if r.dtype == torch.bfloat16:
            tol = dict(atol=2e-2, rtol=2e-2)
        elif r.dtype == torch.float16:
            tol = dict(atol=4e-3, rtol=4e-3)
        elif r.dtype == torch.float32:
            tol = dict(atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(g, r, equal_nan=True, **tol, msg=lambda m, k=k: f"output {k}: {m}")


def check(fn, *inputs, **kw):
    """Compile `fn`, run it on `inputs`, compare every output with eager; returns the CompiledGraph."""
    compiled = compile_fn(fn, *inputs, **kw)
    with torch.no_grad():
        assert_same(compiled(*inputs), fn(*inputs))
    return compiled


def count_externs(compiled) -> int:
    return sum(1 for line in str(compiled.artefacts["schedule"]).splitlines() if line.startswith("extern"))


def compile_for_triton(fn, *inputs, device: str = TRITON_TEST_DEVICE):
    """`fn` traced and compiled for the Triton target on `device` (the interpreter on CPU, the GPU under
    KILN_TRITON_TEST_DEVICE=cuda), the graph not fallen back: (the compiled graph, the inputs on `device`, the
    kernel builds it recorded, for `assert_compiles_for_sm90`)."""
    inputs = [x.to(device) for x in inputs]
    with recording_builds() as builds:
        compiled = compile_aten_graph(trace(fn, *inputs), list(inputs), {"cpu_backend": "triton"})
    assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
    return compiled, inputs, builds


def check_triton(fn, *inputs, device: str = TRITON_TEST_DEVICE):
    """`fn` compiled for the Triton target on `device`, compared with eager, with no ATen externs left, and its
    kernels compiled for sm_90 (tests/support/triton_sm90.py)."""
    compiled, inputs, builds = compile_for_triton(fn, *inputs, device=device)
    assert_compiles_for_sm90(builds)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]
    with torch.no_grad():
        assert_same(compiled(*inputs), fn(*inputs))
    return compiled


"""The sm_90 compile of tests/support/triton_sm90.py: it compiles what Triton compiles and reports what it rejects.

A kernel that compiles comes back with no error; one that Triton's compiler rejects (a Python scalar stored
where a block must be, as kiln once printed bf16 constants) comes back named, with Triton's message. Both are
written as kiln writes its kernel modules: a module of @triton.jit functions importing kiln's helpers.
"""
from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("triton")

from support.triton_sm90 import compile_for_sm90  # noqa: E402

MODULE = '''
import triton
import triton.language as tl

from kiln.codegen.triton.helpers import *  # noqa: F401,F403


@triton.jit
def stores_a_block(buf0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(buf0 + xindex, tl.full([1], 0.0, tl.float32).to(tl.bfloat16), xmask)


@triton.jit
def stores_a_scalar(buf0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tl.store(buf0 + xindex, kiln_to_bf16(0.0), xmask)
'''


def build(path, name: str) -> dict:
    source = path.read_text()
    start = source.index(f"def {name}(")
    end = source.find("\n@triton.jit", start)
    return {"path": str(path), "name": name, "source": source[start:end if end > 0 else None], "dtypes": ["bfloat16"],
            "ints": [1000], "constexprs": {"XBLOCK": 128}, "options": {"num_warps": 4}}


def test_a_kernel_triton_rejects_is_reported_by_name(tmp_path):
    path = tmp_path / "kernels.py"
    path.write_text(textwrap.dedent(MODULE))
    failures = compile_for_sm90([build(path, "stores_a_block"), build(path, "stores_a_scalar")])
    assert list(failures) == ["stores_a_scalar"], failures
    assert "CompilationError" in failures["stores_a_scalar"], failures

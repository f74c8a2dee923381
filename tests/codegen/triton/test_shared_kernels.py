"""Kernels equal up to names are one @triton.jit function, compiled once (kiln/codegen/triton/shared_kernels.py).

Repeated layers print the same kernel with other buffer names; each copy was compiled by Triton again. Here the
copies of a block repeated in one graph share a function, kernels that differ in anything else (a constant, a
dtype, an operation) do not, and the graphs still compute what eager computes.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from kiln.codegen.triton.shared_kernels import share_identical_kernels
from kiln.pipeline import compile_aten_graph
from support.lowering import assert_same, trace
from support.triton_device import DEVICE, skip_unless_kernels_run
from support.triton_sm90 import assert_compiles_for_sm90, recording_builds

pytest.importorskip("triton")

MODULE = '''
@triton.jit
def triton_a(buf1, arg0, xnumel, XBLOCK: tl.constexpr):
    """pointwise kernel: buf1"""
    x = tl.arange(0, XBLOCK)
    tl.store(buf1 + x, tl.load(arg0 + x) * 2.0, x < xnumel)


_launch_triton_a = Launcher(triton_a, 2, num_warps=4, XBLOCK=1024)


@triton.jit
def triton_b(buf7, buf3, xnumel, XBLOCK: tl.constexpr):
    """pointwise kernel: buf7"""
    x = tl.arange(0, XBLOCK)
    tl.store(buf7 + x, tl.load(buf3 + x) * 2.0, x < xnumel)


_launch_triton_b = Launcher(triton_b, 2, num_warps=8, XBLOCK=512)


@triton.jit
def triton_c(buf9, buf8, xnumel, XBLOCK: tl.constexpr):
    """pointwise kernel: buf9"""
    x = tl.arange(0, XBLOCK)
    tl.store(buf9 + x, tl.load(buf8 + x) * 3.0, x < xnumel)


@triton.jit
def triton_d(buf9, buf8, xnumel, XBLOCK: tl.constexpr):
    x = tl.arange(0, XBLOCK)
    tl.store(buf8 + x, tl.load(buf9 + x) * 2.0, x < xnumel)


@triton.jit
def triton_e(buf12, buf11, xnumel, XBLOCK: tl.constexpr):
    """pointwise kernel:
    buf12, over two lines"""
    # segment 0: buf12
    x = tl.arange(0, XBLOCK)  # buf11's elements
    tl.store(buf12 + x, tl.load(buf11 + x) * 2.0, x < xnumel)
'''


def test_a_kernel_equal_up_to_names_becomes_a_name_of_the_first():
    shared = share_identical_kernels(MODULE)
    namespace = {}
    exec(compile(shared.replace("@triton.jit\n", ""), "<kernels>", "exec"), {"Launcher": lambda *a, **k: (a, k)},
         namespace)
    assert namespace["triton_b"] is namespace["triton_a"]  # other names, docstring, launch configuration
    assert namespace["triton_c"] is not namespace["triton_a"]  # another constant
    assert namespace["triton_d"] is not namespace["triton_a"]  # arguments in another order
    assert namespace["triton_e"] is namespace["triton_a"]  # comments and a docstring of two lines
    assert shared.count("@triton.jit") == 3
    assert namespace["_launch_triton_b"][1] == {"num_warps": 8, "XBLOCK": 512}  # its own configuration


def repeated_blocks(x, *weights):
    """A block (a matmul, then a normalization with a residual: one kernel after the matmul) repeated with each
    weight: the same kernel for the blocks of one width."""
    outs = []
    for w in weights:
        if x.shape[-1] != w.shape[0]:
            x = torch.cat([x, x], -1)
        x = torch.nn.functional.layer_norm(x @ w, w.shape[-1:]).relu() * 0.5 + x
        outs.append(x)
    return outs


# CI runs float32 (KILN_MATRIX_SWEEP=1: bf16 too): the kernels shared are the same in either dtype
@pytest.mark.sampled(every=2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repeated_blocks_compile_each_kernel_once_and_match_eager(dtype):
    """On the CPU the kernels run interpreted and are compiled for sm_90 apart; on a GPU they are compiled and
    run for real."""
    skip_unless_kernels_run()
    x = torch.randn(6, 16, dtype=dtype, device=DEVICE)
    weights = [torch.randn(n, n, dtype=dtype, device=DEVICE) / n for n in (16, 16, 16, 32, 32, 32)]
    interpreted = DEVICE == "cpu"
    with recording_builds() if interpreted else contextlib.nullcontext([]) as builds:
        compiled = compile_aten_graph(trace(repeated_blocks, x, *weights), [x, *weights], {"cpu_backend": "triton"})
    assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
    source = compiled.artefacts["kernels.py"]
    assert source.count("@triton.jit") < compiled.num_kernels, source
    assert "the same kernel up to names" in source
    assert_same(compiled(x, *weights), repeated_blocks(x, *weights))
    if interpreted:
        assert_compiles_for_sm90(builds)

"""A norm's backward recomputes its normalized input on the GPU target, and its Triton kernels compile for sm_90.

The LayerNorm and RMSNorm blocks of tests/support/training_patterns.py, trained in bf16 autocast, compiled for
CUDA on fake tensors (tests/support/fake_cuda.py, nothing launched): the forward saves the norm's input and the
per-row statistics, not the float32 normalized input, and the backward kernels that recompute it from them
compile with Triton's own compiler for an H100 (tests/support/triton_sm90.py). CI compiles two of the four
blocks; KILN_SM90_MODELS=all compiles every one.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

pytest.importorskip("triton")

from support.fake_cuda import compile_model  # noqa: E402
from support.sweeps import full  # noqa: E402
from support.training_patterns import D, NormBlock, RMSNorm  # noqa: E402
from support.triton_sm90 import assert_compiles_for_sm90, recording_builds  # noqa: E402

ROWS = (4, 32)


def saved_tensors(backward) -> list[torch.Tensor]:
    """The backward graph's inputs that the forward saved (its tangent, the loss's, comes last)."""
    return [n.meta["val"] for n in backward.artefacts["aten_graph"].gm.graph.find_nodes(op="placeholder")][:-1]


NORMS = {"layernorm": lambda: nn.LayerNorm(D), "rmsnorm": lambda: RMSNorm(D)}
# CI: the Llama-style RMSNorm of the float32 stream and LayerNorm of a bf16 input; KILN_SM90_MODELS=all: all four
CASES = [(norm, stream) for norm in NORMS for stream in (True, False)
         if full("KILN_SM90_MODELS", "all") or (norm == "rmsnorm") == stream]


@pytest.mark.parametrize("norm, stream", CASES, ids=[f"{n}-{'stream' if s else 'bf16'}" for n, s in CASES])
def test_norm_backward_recomputes_the_normalized_input_and_compiles_for_sm90(norm, stream):
    with recording_builds() as builds:
        forward, backward = compile_model(NormBlock(NORMS[norm](), stream), [torch.randn(*ROWS, D)], train=True,
                                          amp=torch.bfloat16, name="graph_norm")
    wide_fp32 = [t for t in saved_tensors(backward) if t.dtype == torch.float32 and tuple(t.shape) == (*ROWS, D)]
    assert len(wide_fp32) == (1 if stream else 0), [(t.dtype, tuple(t.shape)) for t in saved_tensors(backward)]
    assert any(tuple(t.shape) == (*ROWS, 1) for t in saved_tensors(backward)), "the per-row statistics"
    assert backward.num_kernels > 0
    assert_compiles_for_sm90(builds)

"""A linear layer's bias on the GPU: added by the Triton kernel of what reads the result, not by cuBLASLt.

Eager's `addmm` with a bias vector asks cuBLASLt for a bias epilogue, whose algorithm query costs the host more per
call than a plain `mm` and a pointwise add fused into the next kernel: a ViT-B/16 at batch 1, host-bound on its 48
linear layers, issued its step in 4.9 ms against torch.compile's 3.0 (which unfuses so too). On CUDA a float32
`addmm` of a small result whose only readers are kernels (pointwise, or reductions: a layer norm) becomes `mm` plus
`bias + mm` fused into those readers (kiln/codegen/triton/templates.py `_unfused_bias`); one read by an extern
(attention, another matmul) or returned as it is stays `addmm`, as the add would cost a kernel of its own; so do a
large one (bound by the GPU, where the epilogue is free) and a bf16 one, whose mm would round before the add.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

import kiln  # noqa: E402
from support.fake_cuda import compile_inference  # noqa: E402
from support.triton_device import DEVICE  # noqa: E402


class Block(nn.Module):
    """A transformer MLP with its residual: the first linear read by GELU, the second by the residual add."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


class NormedBlock(Block):
    """A post-norm MLP: the second linear's result is read by the layer norm alone, a reduction."""

    def __init__(self, width: int = 256):
        super().__init__(width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.down(nn.functional.gelu(self.up(x))))


class Head(nn.Module):
    """A linear whose result is returned as it is, and one read by a matmul: both stay addmm."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.first, self.second = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        h = self.first(x)
        return self.second(h), h @ x.t()


def _calls(wrapper: str, op: str) -> int:
    return sum(f"aten.{op}." in line or f"torch.{op}(" in line for line in wrapper.splitlines())


def test_biases_read_by_pointwise_ops_are_added_in_their_kernels():
    graph = compile_inference(Block(), [torch.randn(512, 256)])
    wrapper = graph.artefacts["wrapper.py"]
    assert _calls(wrapper, "addmm") == 0 and _calls(wrapper, "mm") == 2, wrapper
    assert graph.artefacts["num_kernels"] == 2, wrapper  # bias + GELU, bias + residual


def test_biases_read_by_a_reduction_are_added_in_its_kernel():
    """Torch.compile's rule too: a layer norm reading the linear's result adds the bias in its own kernel."""
    graph = compile_inference(NormedBlock(), [torch.randn(512, 256)])
    wrapper = graph.artefacts["wrapper.py"]
    assert _calls(wrapper, "addmm") == 0 and _calls(wrapper, "mm") == 2, wrapper
    assert graph.artefacts["num_kernels"] == 2, wrapper  # bias + GELU, bias + layer norm


def test_biases_of_results_returned_or_read_by_a_matmul_stay_in_addmm():
    graph = compile_inference(Head(512), [torch.randn(512, 512)])
    wrapper = graph.artefacts["wrapper.py"]
    assert _calls(wrapper, "addmm") == 2, wrapper


def test_large_results_keep_their_bias_in_addmm():
    """A large result is GPU-bound: cuBLASLt's epilogue adds its bias for free, and an add that failed to fuse
    would pass over the whole result."""
    graph = compile_inference(Block(), [torch.randn(16384, 256)])
    wrapper = graph.artefacts["wrapper.py"]
    assert _calls(wrapper, "addmm") == 2 and _calls(wrapper, "mm") == 0, wrapper


def test_half_type_biases_stay_in_addmm():
    graph = compile_inference(Block().to(torch.bfloat16), [torch.randn(512, 256, dtype=torch.bfloat16)])
    wrapper = graph.artefacts["wrapper.py"]
    assert _calls(wrapper, "addmm") == 2 and _calls(wrapper, "mm") == 0, wrapper


@pytest.mark.skipif(DEVICE != "cuda", reason="the rewrite is the GPU's: on the CPU addmm stays")
@pytest.mark.parametrize("block", [Block, NormedBlock])
def test_unfused_biases_match_eager_on_the_gpu(block):
    model = block().to(DEVICE)
    x = torch.randn(512, 256, device=DEVICE)
    with torch.no_grad():
        want = model(x)
        got = kiln.compile(model)(x)
    torch.testing.assert_close(got, want)

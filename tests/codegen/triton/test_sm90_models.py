"""The Triton kernels of real model graphs compile for an H100 (sm_90), checked on a machine without a GPU.

Each model (tests/support/small_models.py: GPT-2, a Llama-style decoder, BERT, ViT, a Swin-style network,
ConvNeXt-style blocks, a ResNet) is compiled by kiln for CUDA on fake tensors (tests/support/fake_cuda.py):
the forward and backward graphs of a training step, in float32 or in bfloat16 autocast, or the inference graph
of the model in bfloat16. Nothing is launched. Every graph must compile without a fallback (the tests run under
KILN_STRICT=1), and its Triton kernels are compiled for sm_90 by Triton's own compiler and ptxas
(tests/support/triton_sm90.py): a kernel that Triton rejects fails here, not on a user's GPU.

CI compiles each model once, in a dtype that alternates between models, and a fixed sample of each graph's
kernels (kernels shared between graphs, by content, are compiled once). `KILN_SM90_MODELS=all` compiles every
model in every mode, and all of their kernels.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("transformers")

from support.fake_cuda import allow_fake_cuda, compile_model  # noqa: E402
from support.small_models import MODELS  # noqa: E402
from support.sweeps import full  # noqa: E402
from support.triton_sm90 import assert_compiles_for_sm90, content_key, recording_builds  # noqa: E402

FULL = full("KILN_SM90_MODELS", "all")
MODES = ("train-fp32", "train-bf16", "infer-bf16")
# CI: one mode per model, both training dtypes covered, bf16 where the failures were (Llama, Swin)
CI_MODES = {"gpt2": "train-fp32", "llama": "train-bf16", "bert": "train-bf16", "vit": "train-fp32",
            "swin": "train-bf16", "convnext": "train-bf16", "resnet": "train-fp32"}
KERNELS_PER_GRAPH = 4  # in CI: a fixed sample of each graph's kernels


def cases():
    if FULL:
        return [(name, mode) for name in MODELS for mode in MODES]
    return list(CI_MODES.items())


def build(name: str, mode: str):
    """(model, inputs, train, amp) for `mode`: a training step (loss) in fp32 or bf16 autocast, or inference
    with the model's weights in bf16 (as the zoo's bf16 inference workloads run)."""
    task, dtype = mode.split("-")
    train = task == "train"
    model, inputs = MODELS[name](train)
    if train:
        return model, inputs, True, torch.bfloat16 if dtype == "bf16" else None
    return model.to(torch.bfloat16), [x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs], False, \
        None


def sample(builds: list[dict]) -> list[dict]:
    """All of `builds` under KILN_SM90_MODELS=all, else KERNELS_PER_GRAPH of each graph's kernels, picked by
    content key (a fixed choice that does not follow the kernels' order)."""
    if FULL:
        return builds
    by_graph: dict[str, list[dict]] = {}
    for b in builds:
        by_graph.setdefault(b["path"], []).append(b)
    return [b for group in by_graph.values() for b in sorted(group, key=content_key)[:KERNELS_PER_GRAPH]]


@pytest.mark.parametrize("name, mode", cases(), ids=[f"{n}-{m}" for n, m in cases()])
def test_model_kernels_compile_for_sm90(name, mode):
    model, inputs, train, amp = build(name, mode)
    with recording_builds() as builds:
        graphs = compile_model(model, inputs, train=train, amp=amp, name=f"graph_{name}")
    kinds = [g.artefacts["name"].split("/")[-1] for g in graphs]
    assert kinds == (["forward", "backward"] if train else ["inference"]), kinds
    for g in graphs:
        assert "fallback" not in g.artefacts, g.artefacts.get("fallback")
        assert g.num_kernels > 0, g.artefacts["name"]
    # every launcher recorded: one per kernel, two for a split reduction (its partial and combining kernels)
    assert len(builds) == sum(str(g.artefacts["kernels.py"]).count(" = Launcher(") for g in graphs)
    assert_compiles_for_sm90(sample(builds))


class CudnnAttention(torch.nn.Module):
    """Causal self-attention through cuDNN's fused kernel, as SDPA picks it on an H100 for bf16 inference."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.qkv, self.heads = torch.nn.Linear(dim, 3 * dim), heads

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, True)[0]
        return out.transpose(1, 2).reshape(b, n, c).relu()


def test_fused_attention_at_inference_binds_only_what_it_reads():
    """cuDNN attention returns None for the logsumexp nobody asked for, where its fake result has a tensor:
    the wrapper must not take it out of the result (Llama bf16 inference raised on the GPU reading its strides)."""
    model = CudnnAttention().to(torch.bfloat16)
    with recording_builds() as builds:
        graphs = compile_model(model, [torch.randn(2, 16, 64, dtype=torch.bfloat16)], train=False, amp=None)
    wrapper = graphs[0].artefacts["wrapper.py"]
    assert "_scaled_dot_product_cudnn_attention" in wrapper, wrapper
    call = next(line for line in wrapper.splitlines() if "_scaled_dot_product_cudnn_attention" in line)
    result = call.split("=")[0].strip()
    assert f"{result}[0]" in wrapper and f"{result}[1]" not in wrapper, wrapper
    assert_compiles_for_sm90(builds)


def symbolic_cuda_tensors(count: int, size: tuple, dynamic_dim: int) -> list[torch.Tensor]:
    """`count` fake CUDA tensors of `size` whose dimension `dynamic_dim` is one symbol, as a capture with a dynamic
    sequence length hands them to the code generator."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    allow_fake_cuda()
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dims = [DimDynamic.DYNAMIC if d == dynamic_dim else DimDynamic.STATIC for d in range(len(size))]
    shaped = mode.from_tensor(torch.empty(size), symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))
    with mode:
        return [torch.empty_strided(shaped.shape, shaped.stride(), device="cuda") for _ in range(count)]


def _efficient_attention_forward(q, k, v):
    out, logsumexp, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
    return out.relu(), logsumexp, seed, offset


def _efficient_attention_backward(grad, q, k, v, out, logsumexp, seed, offset):
    return torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        grad * 2, q, k, v, None, out, logsumexp, seed, offset, 0.0, [True, True, True, False])[:3]


def test_memory_efficient_attention_over_a_symbolic_sequence_compiles():
    """SDPA's choice on an H100 for float32 training: the logsumexp that memory-efficient attention saves for its
    backward has rows rounded up to 32 (`32*ceil(n/32)`), so with a symbolic sequence length its strides hold a
    division of the size. The forward returning it and the backward reading it failed to lower (TypeError:
    a view with such strides was not taken for a view of its buffer) where the static sizes compiled."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.pipeline import compile_aten_graph

    q, k, v = symbolic_cuda_tensors(3, (2, 2, 12, 8), dynamic_dim=2)
    with q.fake_mode:
        forward = make_fx(_efficient_attention_forward)(q, k, v)
        saved = forward(q, k, v)
        grad = torch.empty_like(q)
        backward = make_fx(_efficient_attention_backward)(grad, q, k, v, *saved)
    assert "CeilToInt" in str(saved[1].stride()), saved[1].stride()  # the rows rounded up to 32
    with recording_builds() as builds:
        graphs = [compile_aten_graph(forward, [q, k, v]), compile_aten_graph(backward, [grad, q, k, v, *saved])]
    for g in graphs:
        assert "fallback" not in g.artefacts, g.artefacts.get("fallback")
        assert g.num_kernels > 0, g.artefacts["name"]
    assert_compiles_for_sm90(builds)

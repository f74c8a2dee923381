"""The patterns of a bf16-autocast transformer's training step whose saved tensors the partition chooses:
LayerNorm and RMSNorm (transformers' LlamaRMSNorm spelling) of a float32 residual stream or of a bf16 linear's
output, GELU and gated SiLU MLPs, softmax attention, residual adds and dropout. Each module returns its loss.

CUDA autocast runs LayerNorm and softmax in float32 where the CPU's does not, so those casts are written out,
as CUDA's autocast inserts them: the graphs are the GPU's on either device.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

D = 64


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, as written there."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


class NormBlock(nn.Module):
    """A pre-norm sublayer's input side: the norm of a residual stream (float32 under autocast: x + a bf16
    linear) or of a bf16 linear's output, then the linear it feeds."""

    def __init__(self, norm: nn.Module, stream: bool):
        super().__init__()
        self.lin0, self.norm, self.lin1, self.stream = nn.Linear(D, D), norm, nn.Linear(D, D), stream

    def forward(self, x):
        h = x + self.lin0(x) if self.stream else self.lin0(x)
        y = self.norm(h.float()) if isinstance(self.norm, nn.LayerNorm) else self.norm(h)
        return self.lin1(y).float().pow(2).mean()


class Mlp(nn.Module):
    """fc -> activation -> fc, or Llama's gated form act(gate(x)) * up(x) -> down."""

    def __init__(self, act, gated=False):
        super().__init__()
        self.fc, self.out, self.act = nn.Linear(D, 4 * D), nn.Linear(4 * D, D), act
        self.up = nn.Linear(D, 4 * D) if gated else None

    def forward(self, x):
        h = self.act(self.fc(x))
        if self.up is not None:
            h = h * self.up(x)
        return self.out(h).float().pow(2).mean()


class Attention(nn.Module):
    """Attention written out as Hugging Face's eager path does: softmax in float32, probabilities cast back,
    dropped out."""

    def __init__(self, p=0.0):
        super().__init__()
        self.qkv, self.proj, self.p = nn.Linear(D, 3 * D), nn.Linear(D, D), p

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / D ** 0.5
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        probs = F.dropout(probs, self.p, self.training)
        return self.proj(probs @ v).float().pow(2).mean()


class ResidualMlps(nn.Module):
    """Three residual MLP blocks, x = x + mlp(x): the backward reads the stream only through the branches."""

    def __init__(self, depth=3, p=0.0):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Dropout(p), nn.Linear(2 * D, D))
                                    for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.float().pow(2).mean()


PATTERNS = {
    "layernorm-of-stream": lambda: NormBlock(nn.LayerNorm(D), stream=True),
    "layernorm-of-bf16": lambda: NormBlock(nn.LayerNorm(D), stream=False),
    "rmsnorm-of-stream": lambda: NormBlock(RMSNorm(D), stream=True),
    "rmsnorm-of-bf16": lambda: NormBlock(RMSNorm(D), stream=False),
    "gelu-mlp": lambda: Mlp(nn.GELU()),
    "gelu-tanh-mlp": lambda: Mlp(nn.GELU("tanh")),
    "silu-gated-mlp": lambda: Mlp(nn.SiLU(), gated=True),
    "softmax": lambda: Attention(),
    "residual-adds": lambda: ResidualMlps(),
    "dropout": lambda: ResidualMlps(depth=2, p=0.1),
}

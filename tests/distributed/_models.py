"""Small models and a training loop shared by the distributed scenarios (each runs on every rank)."""
from __future__ import annotations

import os

import torch
from torch import nn


class MLP(nn.Sequential):
    """Three linear layers: with a tiny bucket_cap_mb, each layer's parameters fill one DDP bucket."""

    def __init__(self):
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


class Block(nn.Module):
    """A residual feed-forward block, the unit FSDP2 shards (as a transformer block)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, depth: int = 2, width: int = 16):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def batch(rank: int, step: int, shape=(6, 8)) -> torch.Tensor:
    """Different data on each rank and step, the same in the eager and the compiled run."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(100 * step + rank))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, steps: int = 3) -> list[float]:
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(batch(rank, step)).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def strict(on: bool) -> None:
    """KILN_STRICT for the scenarios that follow on this rank (kiln reads it at each fallback)."""
    os.environ["KILN_STRICT"] = "1" if on else "0"


def max_difference(params, reference) -> float:
    """The largest elementwise difference between two parameter lists (full tensors of DTensors)."""
    def full(p):
        return p.full_tensor() if hasattr(p, "full_tensor") else p

    return max((full(p).detach().float() - full(q).detach().float()).abs().max().item()
               for p, q in zip(params, reference, strict=True))

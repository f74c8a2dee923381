"""A small ViT-style classifier trained on random 32x32 images: the seeds' training loop, CPU-sized.

Run it eagerly with `python kiln/examples/vit_train.py`, or through kiln with
`python -m kiln run` (which routes its `torch.compile` call to `kiln.compile`).
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.heads = heads

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self, dim: int = 64, depth: int = 2, heads: int = 4, classes: int = 10):
        super().__init__()
        self.embed = PatchEmbed(4, dim)
        self.pos = nn.Parameter(torch.zeros(1, 64, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        x = self.embed(images) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def train(model, steps: int, batch: int = 32) -> float:
    """A few SGD steps on random data; returns the mean step time in ms (after the first step)."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (batch,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return 1000 * sum(times[1:]) / max(1, len(times) - 1)


def main(steps: int = 6) -> str:
    torch.manual_seed(0)
    eager = TinyViT()
    compiled = TinyViT()
    compiled.load_state_dict(eager.state_dict())
    eager_ms = train(eager, steps)
    start = time.perf_counter()
    compiled_model = torch.compile(compiled)
    compiled_ms = train(compiled_model, steps)
    first = time.perf_counter() - start
    summary = (f"eager step: {eager_ms:.1f} ms | compiled step: {compiled_ms:.1f} ms | "
               f"speedup {eager_ms / compiled_ms:.2f}x | first compiled run (compile + {steps} steps): {first:.1f} s")
    return summary  # `python -m kiln run` prints it in its report, once


if __name__ == "__main__":
    print(main())

"""How fast kiln's generated Triton kernels are, one fused op at a time, at GPT-2 training sizes.

The GPT-2 profile showed kiln's Triton kernels taking 3x torch.compile's time with the same
matmuls. This isolates the kernel kinds a transformer step is made of (pointwise GELU,
bias-gradient column sums, row reductions, layer norm, cross-entropy) and times each
three ways with CUDA events (median): eager, torch.compile, kiln. Each row gives the
bytes the op must move at least and the bandwidth each compiler reached, so a slow kernel
stands out without knowing the GPU. kiln's kernel sources go to `--kernels DIR`.

    python benchmarks/kernel_quality.py [--only NAME] [--kernels DIR] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
import kiln

DEV = "cuda"
T, D, FF, V = 8192, 768, 3072, 50257   # tokens (8 x 1024), width, MLP width, vocabulary


def gelu_tanh(x, b):
    y = x + b
    return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))


def column_sum(g):
    return g.sum(0)


def row_sum(x):
    return x.sum(-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def softmax(x):
    return torch.softmax(x, -1)


def cross_entropy(logits, target):
    return F.cross_entropy(logits.float(), target)


def transpose_copy(x):
    return x.t().contiguous()


def add_mul(x, y):
    return (x + y) * 0.5


def cases():
    bf = dict(device=DEV, dtype=torch.bfloat16)
    t = lambda *s: torch.randn(*s, **bf)  # noqa: E731
    target = torch.randint(0, V, (T,), device=DEV)
    return {
        # name: (fn, args, bytes moved at least)
        "add_mul [8192,3072] bf16": (add_mul, (t(T, FF), t(T, FF)), 3 * T * FF * 2),
        "gelu_tanh [8192,3072] bf16": (gelu_tanh, (t(T, FF), t(FF)), 2 * T * FF * 2),
        "column_sum [8192,3072] bf16": (column_sum, (t(T, FF),), T * FF * 2),
        "column_sum [8192,768] bf16": (column_sum, (t(T, D),), T * D * 2),
        "column_sum [8192,768] fp32": (column_sum, (torch.randn(T, D, device=DEV),), T * D * 4),
        "row_sum [8192,768] bf16": (row_sum, (t(T, D),), T * D * 2),
        "layer_norm [8192,768] bf16": (layer_norm, (t(T, D), t(D), t(D)), 2 * T * D * 2),
        "softmax [4096,1024] bf16": (softmax, (t(4096, 1024),), 2 * 4096 * 1024 * 2),
        "cross_entropy [8192,50257] bf16->fp32": (cross_entropy, (t(T, V), target), T * V * 2),
        "transpose_copy [8192,768] bf16": (transpose_copy, (t(T, D),), 2 * T * D * 2),
    }


def cuda_ms(fn, args, warmup=5, iters=30) -> float:
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def max_err(a, b) -> float:
    a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
    return float((a - b).abs().max() / (b.abs().max() + 1e-6))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=None)
    p.add_argument("--kernels", default=None, help="write kiln's kernel sources under this directory")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows = []
    for name, (fn, args, nbytes) in cases().items():
        if a.only and a.only not in name:
            continue
        if a.kernels:
            os.environ["KILN_DEBUG_DIR"] = os.path.join(a.kernels, name.split()[0])
        kiln_fn = kiln.compile(fn, options={"trace.enabled": bool(a.kernels)})
        torch_fn = torch.compile(fn)
        ref = fn(*args)
        row = {"case": name, "kiln_rel_err": max_err(kiln_fn(*args), ref)}
        for label, f in (("eager", fn), ("torch", torch_fn), ("kiln", kiln_fn)):
            ms = cuda_ms(f, args)
            row[f"{label}_ms"] = round(ms, 4)
            row[f"{label}_GBps"] = round(nbytes / ms / 1e6, 1)
        rows.append(row)
        print(f"{name:<40} eager {row['eager_ms']:7.3f} ms {row['eager_GBps']:7.0f} GB/s | "
              f"torch {row['torch_ms']:7.3f} {row['torch_GBps']:7.0f} | "
              f"kiln {row['kiln_ms']:7.3f} {row['kiln_GBps']:7.0f}  err {row['kiln_rel_err']:.1e}",
              flush=True)
        torch._dynamo.reset()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

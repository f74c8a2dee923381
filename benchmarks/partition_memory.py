#!/usr/bin/env python3
"""What kiln's min-cut partitioner saves for backward, against save-all and against eager (CPU).

For each model, one training step (forward, loss, backward) runs eagerly and
through kiln's autograd stage (`aot_eager`: the same ATen ops, so the numbers
are the partition's, not a code generator's). Reported per model:

  saved_bytes_kiln        bytes the compiled forward saves for backward (min-cut); saved_input_bytes_kiln
                          of them are inputs' (parameters, the batch), alive anyway
  saved_bytes_naive       bytes the naive partition would save (every forward tensor the backward reads)
  saved_bytes_eager       bytes eager autograd saves (saved_tensors_hooks, unique storages)
  retained_after_forward  CPU bytes still allocated after forward+loss (activations held for backward)
  peak_step               CPU peak of allocated bytes over forward+loss+backward, above the start
                          (from the profiler's allocation events: torch's CPU allocator reports)
  peak_step_compiled      the same peak for the whole step compiled, per compiler (`--compilers`): eager,
                          kiln (kiln.compile, its default backend: the C++ code generator) and torch.compile
                          (Inductor); the memory a training step holds once its graphs are generated code

Models: transformer6 and the Fashion-MNIST CNN from /work/shared/bench/models_bench.py, and a
GPT-2-style block (d 768, 12 heads, causal attention written out as HF GPT-2 does, GELU-tanh,
dropout 0.1). Batch sizes are smaller than the GPU bench's so that a shared CPU runs it in about a
minute; every byte count scales linearly with the batch.

    python benchmarks/partition_memory.py [--out PATH]
        (default PATH: benchmarks/results/partition_memory/<date>_cpu_<commit>.json)
        [--models transformer6,cnn_fashion,gpt2_block] [--batch-scale 4] [--compilers eager,kiln,torch]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from common import cpu_allocation_profile, result_path  # noqa: E402
from kiln.autograd import aot_eager  # noqa: E402


class TransformerBlock(nn.Module):
    """models_bench.py's block: LN -> MHA -> residual -> LN -> MLP(GELU) -> residual."""

    def __init__(self, d=512, heads=8, ff=2048):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class FashionCNN(nn.Module):
    """models_bench.py's tutorial CNN for 28x28 Fashion-MNIST."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc2(torch.relu(self.fc1(x)))


class GPT2Block(nn.Module):
    """One GPT-2 block as transformers' eager GPT2Block computes it (dropout 0.1 everywhere)."""

    def __init__(self, d=768, heads=12, seq=256, p=0.1):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        w = w.masked_fill(~self.bias, torch.finfo(torch.float32).min)
        w = F.dropout(F.softmax(w, dim=-1), self.p, training=True)
        a = torch.matmul(w, v).transpose(1, 2).reshape(b, t, d)
        x = x + F.dropout(self.c_proj(a), self.p, training=True)
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + F.dropout(self.mlp_proj(h), self.p, training=True)


def workloads(batch_scale: float):
    def bs(n):
        return max(1, int(n * batch_scale))

    g = torch.Generator().manual_seed(0)
    yield ("transformer6", lambda: nn.Sequential(*[TransformerBlock() for _ in range(6)]),
           torch.randn(bs(8), 128, 512, generator=g), lambda out: out.pow(2).mean(),
           {"batch": bs(8), "seq": 128, "d_model": 512, "bench_batch": 32})
    yield ("cnn_fashion", FashionCNN, torch.randn(bs(64), 1, 28, 28, generator=g),
           lambda out: F.cross_entropy(out, torch.arange(out.shape[0]) % 10),
           {"batch": bs(64), "bench_batch": 64})
    yield ("gpt2_block", GPT2Block, torch.randn(bs(4), 256, 768, generator=g), lambda out: out.pow(2).mean(),
           {"batch": bs(4), "seq": 256, "d_model": 768, "heads": 12, "dropout": 0.1})


def eager_saved_bytes(fn) -> int:
    """Bytes of the unique storages eager autograd saves for backward while running `fn()`."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def measure(name, make_model, x, loss_fn, info) -> dict:
    torch.manual_seed(0)
    model = make_model()
    compiled = aot_eager(torch.fx.symbolic_trace(model), [x])
    (split,) = compiled.partitions.values()
    result = {"model": name, **info, "params": sum(p.numel() for p in model.parameters()),
              "saved_tensors_kiln": len(split.saved), "saved_bytes_kiln": split.saved_bytes,
              "saved_input_bytes_kiln": split.saved_input_bytes,
              "saved_tensors_naive": len(split.naive_saved), "saved_bytes_naive": split.naive_bytes,
              "recomputed_ops_in_backward": len(split.recomputed)}
    for label, fn in (("eager", model), ("kiln", compiled)):
        fn(x)  # warm up: lazy allocations out of the measured step
        holder = {}

        def forward(fn=fn, holder=holder):  # the loop's model and holder, bound now
            holder["loss"] = loss_fn(fn(x))

        def step(forward=forward, holder=holder):
            forward()
            holder.pop("loss").backward()

        model.zero_grad(set_to_none=True)
        result[f"saved_bytes_{label}_hooks"] = eager_saved_bytes(forward)
        holder.clear()
        model.zero_grad(set_to_none=True)
        retained, _ = cpu_allocation_profile(forward)
        holder.clear()
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        _, peak = cpu_allocation_profile(step)
        result[f"step_s_{label}_profiled"] = round(time.perf_counter() - start, 3)
        result[f"retained_after_forward_{label}"] = retained
        result[f"peak_step_{label}"] = peak
    result["saved_bytes_eager"] = result.pop("saved_bytes_eager_hooks")
    result["saved_bytes_kiln_runtime"] = result.pop("saved_bytes_kiln_hooks")
    result["kiln_vs_naive"] = round(split.saved_bytes / split.naive_bytes, 3)
    result["kiln_vs_eager_saved"] = round(result["saved_bytes_kiln_runtime"] / result["saved_bytes_eager"], 3)
    result["kiln_vs_eager_peak"] = round(result["peak_step_kiln"] / result["peak_step_eager"], 3)
    result["kiln_vs_eager_retained"] = round(result["retained_after_forward_kiln"]
                                             / result["retained_after_forward_eager"], 3)
    return result


def compiled_peaks(make_model, x, loss_fn, compilers: list[str]) -> dict[str, int]:
    """Peak CPU bytes of one training step (gradients cleared first) per compiler, each on its own copy of the
    model from the same seed, measured after two warm-up steps (compilation and lazy allocations)."""
    peaks = {}
    for compiler in compilers:
        torch.manual_seed(0)
        model = make_model()
        fn = {"eager": lambda m: m, "kiln": kiln.compile, "torch": torch.compile}[compiler](model)

        def step(fn=fn, model=model):
            model.zero_grad(set_to_none=True)
            loss_fn(fn(x)).backward()

        step()
        step()
        model.zero_grad(set_to_none=True)
        peaks[compiler] = cpu_allocation_profile(step)[1]
        torch._dynamo.reset()
        kiln.reset()
    return peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None,
                        help="JSON path (default benchmarks/results/partition_memory/<date>_cpu_<commit>.json)")
    parser.add_argument("--batch-scale", type=float, default=1.0, help="multiply every batch size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default=None, help="comma list of model names (default: all)")
    parser.add_argument("--compilers", default="eager,kiln,torch",
                        help="whose compiled step's peak to measure (eager, kiln, torch; empty: none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    date = datetime.datetime.now(datetime.UTC)
    out = args.out or result_path("partition_memory", "cpu")
    results = []
    for name, make_model, x, loss_fn, info in workloads(args.batch_scale):
        if args.models and name not in args.models.split(","):
            continue
        r = measure(name, make_model, x, loss_fn, info)
        compilers = [c for c in args.compilers.split(",") if c]
        r["peak_step_compiled"] = compiled_peaks(make_model, x, loss_fn, compilers)
        results.append(r)
        mib = 1 << 20
        print(f"{name:13s} saved kiln {r['saved_bytes_kiln'] / mib:8.1f} MiB ({r['saved_tensors_kiln']} tensors) | "
              f"naive {r['saved_bytes_naive'] / mib:8.1f} MiB ({r['saved_tensors_naive']}) | "
              f"eager {r['saved_bytes_eager'] / mib:8.1f} MiB || retained after fw kiln "
              f"{r['retained_after_forward_kiln'] / mib:7.1f} / "
              f"eager {r['retained_after_forward_eager'] / mib:7.1f} MiB"
              f" | peak kiln {r['peak_step_kiln'] / mib:7.1f} / eager {r['peak_step_eager'] / mib:7.1f} MiB"
              " | compiled step peak " + ", ".join(f"{c} {b / mib:.1f}" for c, b in r["peak_step_compiled"].items())
              + " MiB", flush=True)
    doc = {"date": date.isoformat(timespec="seconds"), "command": " ".join(["python"] + sys.argv),
           "torch": torch.__version__, "python": platform.python_version(), "device": "cpu",
           "threads": args.threads, "backend": "aot_eager (kiln autograd stage, ATen ops run as traced)",
           "results": results}
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

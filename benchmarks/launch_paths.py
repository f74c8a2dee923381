"""Which path each of kiln's Triton launches takes in a benchmark step, and why a launch misses the fast one.

A `Launcher` call is cheap only on its fast path (the C launcher called directly); a call that
falls to the specialization table or to the JITFunction costs several times more host time, which
on a host-bound model (ResNet-50 at batch 1) is the step. This script builds one model of the
shared benchmark with kiln, runs warm-up steps, then counts one step's launches by path and names,
for each launcher that left the fast path, the reason: no fast launch compiled, integer arguments
other than the compiled ones, an unaligned tensor, or launch hooks installed.

    python benchmarks/launch_paths.py --bench .bench/models_bench.py --models resnet50_infer_bs1
"""
from __future__ import annotations

import argparse
import collections
import json

import torch

from common import build_step, load_bench, write_json
from kiln.codegen.triton import launch


def _reason(launcher: launch.Launcher, args: tuple) -> str:
    n = launcher.num_tensors
    if launcher.fast is None:
        return "no fast launch"
    if args[n:] != launcher.fast_ints:
        return f"integers {args[n:]} != {launcher.fast_ints}"
    if not launch._no_hooks():
        return "launch hooks"
    if any(args[i].data_ptr() % 16 for i in launcher.check):
        return "unaligned tensor"
    return "fast"


def count_paths(step, steps: int = 1) -> dict:
    """{reason: calls} over `steps` steps, and the kernels behind each slow reason."""
    reasons: collections.Counter = collections.Counter()
    kernels: dict = collections.defaultdict(set)
    original = launch.Launcher.__call__

    def counting(self, grid, *args):
        why = _reason(self, args)
        reasons[why] += 1
        if why != "fast":
            kernels[why].add(getattr(self.fn, "__name__", str(self.fn)))
        return original(self, grid, *args)

    launch.Launcher.__call__ = counting
    try:
        for _ in range(steps):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    finally:
        launch.Launcher.__call__ = original
    return {"calls_per_step": {k: v / steps for k, v in reasons.items()},
            "slow_kernels": {k: sorted(v)[:20] for k, v in kernels.items()}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bench", required=True, help="path to models_bench.py")
    p.add_argument("--models", default="resnet50_infer_bs1")
    p.add_argument("--kiln-opts", default="{}")
    p.add_argument("--out", default=None)
    options = p.parse_args()
    bench = load_bench(options.bench)
    rows = []
    for model in options.models.split(","):
        step = build_step(bench, model, "kiln", json.loads(options.kiln_opts))
        for _ in range(5):
            step()
        row = {"model": model, **count_paths(step, steps=3)}
        print(json.dumps(row, indent=1), flush=True)
        rows.append(row)
    write_json(options.out, rows)


if __name__ == "__main__":
    main()

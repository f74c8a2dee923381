"""Where a compiled step's host (Python) time goes, for one model of the shared benchmark.

The GPU profile (gpu_profile.py) shows kiln's BERT step losing to torch.compile in the
gaps between kernels, not in the kernels. This script times the host side alone: for
each compiler it runs warm-up steps, then

    host_ms    wall time to issue one step, without waiting for the GPU
               (median over steps, each followed by a synchronize that is not timed)
    step_ms    wall time of one step including the synchronize
    back_to_back_ms  wall time per step when steps run back to back (as models_bench runs them)
    syncs_per_step   calls in one step that wait for the GPU (torch.cuda sync debug mode), with places

and, for kiln and torch.compile, a cProfile of a few steps (top functions by own time), so the Python
frames that cost the most are named.

    python benchmarks/host_profile.py --bench .bench/models_bench.py \\
        --models bert_infer_bf16 --compilers torch,kiln --out host.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch

from common import build_step, load_bench, write_json


def step_times(step, n: int) -> tuple[float, float]:
    """(host ms, step ms), medians over `n` steps each started with the GPU idle: the wall time to issue the step,
    and the same with the wait for its GPU work."""
    host, total = [], []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        total.append((t2 - t0) * 1e3)
    return statistics.median(host), statistics.median(total)


def _back_to_back_ms(step, n: int) -> float:
    """Wall time per step with no synchronize between steps, as models_bench runs them: the host
    may run ahead of the GPU, unless something in the step waits for the GPU."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / n


def _synchronizing_calls(step) -> list[str]:
    """The calls in one step that make the host wait for the GPU (torch's sync debug mode), by where they
    were made: a wait inside a compiled step keeps the host from queueing the next step's work."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    places = []
    for w in caught:
        if "synchroniz" in str(w.message):
            places.append(f"{w.filename}:{w.lineno}: {str(w.message)[:120]}")
    return places


def profile_one(bench, model_name: str, compiler: str, opts: dict, steps: int, top: int) -> dict:
    t0 = time.perf_counter()
    step = build_step(bench, model_name, compiler, opts)
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(5):
        step()
    host_ms, step_ms = step_times(step, steps)
    syncs = _synchronizing_calls(step)
    row = {"model": model_name, "compiler": compiler, "first_call_s": round(first, 2),
           "host_ms": round(host_ms, 3), "step_ms": round(step_ms, 3),
           "back_to_back_ms": round(_back_to_back_ms(step, steps), 3),
           "syncs_per_step": len(syncs), "sync_places": syncs[:20]}
    if compiler.startswith(("kiln", "torch")):
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(10):
            step()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        row["cprofile_10_steps"] = text.getvalue()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, help="path to models_bench.py")
    p.add_argument("--models", default="bert_infer_bf16")
    p.add_argument("--compilers", default="eager,torch,kiln")
    p.add_argument("--kiln-opts", default="{}", help="JSON options for kiln.compile")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    bench = load_bench(args.bench)
    rows = []
    for model in args.models.split(","):
        for compiler in args.compilers.split(","):
            opts = json.loads(args.kiln_opts) if compiler == "kiln" else {}
            row = profile_one(bench, model, compiler, opts, args.steps, args.top)
            print({k: v for k, v in row.items() if k != "cprofile_10_steps"}, flush=True)
            if "cprofile_10_steps" in row:
                print(row["cprofile_10_steps"], flush=True)
            rows.append(row)
            torch._dynamo.reset()
    write_json(args.out, rows)


if __name__ == "__main__":
    main()

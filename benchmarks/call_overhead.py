"""Per-call host overhead of kiln's compiled code vs torch.compile and eager, on tiny tensors.

On tensors this small the kernels take a few microseconds, so a call's time is
almost all host (Python) work: the frame entry (guard check + output program),
the autograd runtime, and the generated wrapper (allocations, kernel launches).
Three workloads, each compiled with the default backend (kiln: its C++ target;
torch.compile: inductor) and run single-threaded:

    mlp_bs1_inference     3-layer MLP, batch 1, under no_grad
    chain50_inference     50 layers (25 x Linear(8, 8) + GELU), batch 1, under no_grad
    mlp_bs1_training      the MLP's forward + backward (grads accumulate; no optimizer)

Reported: the median per-call time (over blocks of calls) of eager, kiln and
torch.compile, and a cProfile breakdown of kiln's call (top functions by tottime,
in microseconds per call; cProfile slows everything by a similar factor, so read
the shares, not the absolute numbers).

    python benchmarks/call_overhead.py [--out benchmarks/results/call_overhead/<date>_cpu_<commit>.json]
        [--no-torch-compile] [--no-profile] [--clock wall|thread] [--workloads mlp_bs1_inference,...]
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import platform
import pstats
import statistics
import time

import torch
import torch.nn as nn

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
import kiln


def make_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4))


def make_chain() -> nn.Module:
    layers = []
    for _ in range(25):
        layers += [nn.Linear(8, 8), nn.GELU()]
    return nn.Sequential(*layers)


def inference_step(model):
    def step(x):
        with torch.no_grad():
            return model(x)
    return step


def training_step(model):
    def step(x):
        model(x).sum().backward()
    return step


WORKLOADS = {
    # name: (model factory, input shape, step builder)
    "mlp_bs1_inference": (make_mlp, (1, 16), inference_step),
    "chain50_inference": (make_chain, (1, 8), inference_step),
    "mlp_bs1_training": (make_mlp, (1, 16), training_step),
}


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
clock = time.perf_counter


def per_call_us(step, x, block: int = 200, blocks: int = 25) -> tuple[float, float]:
    """(median, min) over `blocks` of the mean time of `block` consecutive calls."""
    for _ in range(block):
        step(x)
    times = []
    for _ in range(blocks):
        start = clock()
        for _ in range(block):
            step(x)
        times.append((clock() - start) / block)
    return statistics.median(times) * 1e6, min(times) * 1e6


def profile(step, x, calls: int = 2000, top: int = 15) -> list[dict]:
    """cProfile of `calls` calls: the `top` functions by own time, per call."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step(x)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (filename, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        where = name if filename == "~" else f"{_short(filename)}:{line}({name})"
        rows.append({"function": where, "calls_per_call": ncalls / calls, "tottime_us": tottime / calls * 1e6,
                     "cumtime_us": cumtime / calls * 1e6})
    rows.sort(key=lambda r: -r["tottime_us"])
    total = sum(r["tottime_us"] for r in rows)
    return [{**r, "share": r["tottime_us"] / total} for r in rows[:top]]


def _short(filename: str) -> str:
    for marker in ("/kiln/", "/torch/", "<"):
        if marker in filename:
            return filename[filename.index(marker) + (1 if marker != "<" else 0):]
    return filename


def run_workload(name: str, with_torch_compile: bool, with_profile: bool = True) -> dict:
    factory, shape, make_step = WORKLOADS[name]
    torch.manual_seed(0)
    model = factory()
    x = torch.randn(*shape)
    row = {"workload": name}
    row["eager_us"], row["eager_min_us"] = per_call_us(make_step(model), x)
    start = time.perf_counter()
    kiln_step = make_step(kiln.compile(model))
    kiln_step(x)
    row["kiln_first_call_s"] = time.perf_counter() - start
    row["kiln_us"], row["kiln_min_us"] = per_call_us(kiln_step, x)
    if with_torch_compile:
        start = time.perf_counter()
        torch_step = make_step(torch.compile(model))
        torch_step(x)
        row["torch_compile_first_call_s"] = time.perf_counter() - start
        row["torch_compile_us"], row["torch_compile_min_us"] = per_call_us(torch_step, x)
    if with_profile:
        row["kiln_profile"] = profile(kiln_step, x)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--no-torch-compile", action="store_true", help="skip the torch.compile reference")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile breakdown")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="thread: CPU time of the calling thread (steadier on a shared machine; "
                             "misses time waiting, e.g. for OpenMP workers)")
    options = parser.parse_args()
    global clock
    clock = CLOCKS[options.clock]
    torch.set_num_threads(1)
    rows = [run_workload(name, not options.no_torch_compile, not options.no_profile)
            for name in options.workloads.split(",")]
    print(f"per call, us ({options.clock} clock): median (min) over blocks")
    print(f"{'workload':<20} {'eager':>15} {'kiln':>15} {'torch.compile':>15}")
    for r in rows:
        tc = f"{r['torch_compile_us']:>7.1f} ({r['torch_compile_min_us']:>5.1f})" if "torch_compile_us" in r else "-"
        print(f"{r['workload']:<20} {r['eager_us']:>7.1f} ({r['eager_min_us']:>5.1f}) "
              f"{r['kiln_us']:>7.1f} ({r['kiln_min_us']:>5.1f}) {tc:>15}")
    for r in rows:
        if "kiln_profile" not in r:
            continue
        print(f"\nkiln {r['workload']}: top functions by own time (us per call under cProfile)")
        for p in r["kiln_profile"]:
            print(f"  {p['tottime_us']:8.2f} {p['share']:6.1%} {p['calls_per_call']:5.1f}x  {p['function']}")
    if options.out:
        with open(options.out, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                       "torch": torch.__version__, "machine": platform.machine(), "threads": 1, "clock": options.clock,
                       "note": "median per-call wall time of tiny-tensor calls (host overhead dominates); "
                               "kiln_profile: cProfile, us per call, top 15 by own time",
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

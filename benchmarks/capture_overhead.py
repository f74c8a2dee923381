"""Capture time and per-call overhead (guard check + dispatch) of kiln vs torch.compile.

Both compile with a recording "eager" backend, so what is measured is the front
end: capture time on the first call, and on warm calls the time above calling
the captured graph itself with the same inputs (guard check + fetching inputs +
dispatch). Two workloads: a 2-tensor function and a module with
100 parameters (50 Linear(8, 8) layers).

    python benchmarks/capture_overhead.py [--out benchmarks/results/capture_overhead/<date>_<machine>_<commit>.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import torch
import torch.nn as nn

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
import kiln


def two_tensor_fn(x, y):
    return (x + y).relu() * 2


def make_module() -> nn.Module:
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(50)])


def _per_call_us(fn, args, repeat: int = 2000) -> float:
    for _ in range(50):
        fn(*args)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


def measure(name: str, make, args, compile_with) -> dict:
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    target = make()
    start = time.perf_counter()
    compiled = compile_with(target, recording_backend)
    compiled(*args)
    capture_s = time.perf_counter() - start
    assert len(graphs) == 1, f"{name}: expected one graph, got {len(graphs)}"
    gm, inputs = graphs[0]
    graph_us = _per_call_us(gm.forward, inputs)
    compiled_us = _per_call_us(compiled, args)
    return {"workload": name, "capture_ms": capture_s * 1000, "graph_us": graph_us, "compiled_us": compiled_us,
            "overhead_us": compiled_us - graph_us}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    torch.set_num_threads(1)
    x, y = torch.randn(16), torch.randn(16)
    h = torch.randn(2, 8)
    compilers = {
        "kiln": lambda m, b: kiln.compile(m, backend=b),
        "torch.compile": lambda m, b: torch.compile(m, backend=b),
    }
    rows = []
    for cname, compiler in compilers.items():
        torch._dynamo.reset()
        kiln.reset()
        for wname, make, args in (("2-tensor function", lambda: two_tensor_fn, (x, y)),
                                  ("100-parameter module", make_module, (h,))):
            row = measure(wname, make, args, compiler)
            row["compiler"] = cname
            rows.append(row)
    print(f"{'compiler':<14} {'workload':<22} {'capture ms':>11} {'graph us':>10} {'compiled us':>12} "
          f"{'overhead us':>12}")
    for r in rows:
        print(f"{r['compiler']:<14} {r['workload']:<22} {r['capture_ms']:>11.1f} {r['graph_us']:>10.1f} "
              f"{r['compiled_us']:>12.1f} {r['overhead_us']:>12.1f}")
    for w in ("2-tensor function", "100-parameter module"):
        k = next(r for r in rows if r["compiler"] == "kiln" and r["workload"] == w)
        t = next(r for r in rows if r["compiler"] == "torch.compile" and r["workload"] == w)
        print(f"{w}: kiln overhead / torch.compile overhead = {k['overhead_us'] / max(t['overhead_us'], 1e-9):.2f}x")
    if options.out:
        with open(options.out, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                       "torch": torch.__version__, "machine": platform.machine(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

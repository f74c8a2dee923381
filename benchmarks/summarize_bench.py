"""One line per (model, compiler) of a models_bench JSON: median step, speedup over eager, compile s, correctness.

    python benchmarks/summarize_bench.py benchmarks/results/models_bench/<run>.json [...]
"""
from __future__ import annotations

import json
import math
import sys


def rows(path: str) -> list[dict]:
    data = json.load(open(path))
    found = data.get("results", data) if isinstance(data, dict) else data
    return [r for r in found if isinstance(r, dict) and "model" in r]


def summarize(path: str) -> None:
    results = rows(path)
    eager = {r["model"]: r["step_ms"]["median"] for r in results if r["compiler"] == "eager" and r["status"] == "ok"}
    print(f"# {path}")
    speedups: dict[str, list[float]] = {}
    for r in results:
        if r["status"] != "ok":
            print(f"{r['model']:<24} {r['compiler']:<9} {r['status']}: {(r.get('error') or '')[:120]}")
            continue
        ms = r["step_ms"]["median"]
        base = eager.get(r["model"])
        ratio = base / ms if base else float("nan")
        speedups.setdefault(r["compiler"], []).append(ratio)
        print(f"{r['model']:<24} {r['compiler']:<9} {ms:9.3f} ms  {ratio:6.2f}x  compile {r['compile_s']:7.1f} s  "
              f"{r['correctness'].get('status')}")
    for compiler, values in speedups.items():
        good = [v for v in values if v == v]
        if good:
            print(f"geomean {compiler}: {math.exp(sum(map(math.log, good)) / len(good)):.3f}x over {len(good)}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarize(p)

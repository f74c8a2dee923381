"""Host time per ATen op in one step, eager against kiln, from torch.profiler's CPU events.

step_parts.py says which phase of a host-bound step is slower; this says which ops: after
warm-up it profiles a few steps (CPU activity only, so no CUPTI cost) and lists, per compiler,
each ATen op's calls and host microseconds per step. The profiler adds a few microseconds to
every op, so compare the same op across compilers, not absolute totals.

    python benchmarks/host_ops.py --bench .bench/models_bench.py --model cnn_fashion_train \\
        --compilers eager,kiln --out ops.json
    python benchmarks/host_ops.py --model zoo:phi3_train_bf16 --compilers torch,kiln   # a zoo workload
"""
from __future__ import annotations

import argparse

import torch

from common import ZOO, build_step, harness_compiler, load_bench, write_json, zoo_step


def op_table(step, steps: int, top: int) -> list[dict]:
    for _ in range(15):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [{"op": e.key, "calls": round(e.count / steps, 2),
             "self_us": round(e.self_cpu_time_total / steps, 1), "total_us": round(e.cpu_time_total / steps, 1)}
            for e in prof.key_averages()]
    rows.sort(key=lambda r: -r["self_us"])
    return rows[:top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", help="the shared harness's models_bench.py (not for a zoo workload)")
    p.add_argument("--model", default="cnn_fashion_train")
    p.add_argument("--compilers", default="eager,kiln")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    bench = None if args.model.startswith(ZOO) else load_bench(args.bench)
    result = {}
    for compiler in args.compilers.split(","):
        step = zoo_step(args.model, compiler) if bench is None else build_step(bench, args.model,
                                                                               *harness_compiler(compiler))
        rows = op_table(step, args.steps, args.top)
        result[compiler] = rows
        print(f"== {compiler}: {sum(r['self_us'] for r in rows):.0f} us self time in the top {len(rows)}")
        for r in rows:
            print(f"  {r['self_us']:8.1f} us  {r['calls']:5.1f} x  {r['op'][:90]}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()

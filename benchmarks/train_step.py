"""Whole training steps, four ways, compared within one run: step time and compile time.

    eager         the harness's train step as it is
    kiln_module   kiln.compile(model); zero_grad, backward and optimizer.step eager
    kiln_step     kiln.compile(train_step) with kiln.config.compiled_autograd: the forward, the backward
                  (compiled autograd) and the optimizer update (kiln.optim) compiled
    torch_step    torch.compile(train_step) with torch._dynamo.config.compiled_autograd (the reference)

The train step is the harness's (`models_bench.make_step`: zero_grad, autocast forward and loss, backward,
step). Each (model, mode) runs in its own process: the autograd engine binds compiled autograd's node
functions once per process, so kiln's and torch's compiled autograd cannot share one.

    python benchmarks/train_step.py --device cuda --bench /work/shared/bench/models_bench.py \\
        --models transformer6_train,gpt2_train,vit_b16_train --out results.json
    python benchmarks/train_step.py --device cpu --models tiny_train --steps 3   # a smoke test on CPU

`tiny_train` is a two-block transformer built here (no harness needed); `--quick` asks the harness for its
small sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from common import load_bench, write_json

MODES = ("eager", "kiln_module", "kiln_step", "torch_step")
DEFAULT_BENCH = "/work/shared/bench/models_bench.py"


def tiny_workload(bench, device: torch.device):
    """A two-block transformer (the harness's block at d=32) under AdamW, for smoke runs on any machine."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[bench.TransformerBlock(32, 4, 64) for _ in range(2)]).to(device)
    x, y = torch.randn(2, 8, 32, device=device), torch.randn(2, 8, 32, device=device)
    return bench.Workload(kind="train", model=model, args=(x,), target=y, loss_fn=torch.nn.MSELoss(),
                          optim_fn=lambda p: torch.optim.AdamW(p, lr=1e-4))


def build(bench, model_name: str, mode: str, device: torch.device, quick: bool):
    """The harness's train step for `model_name`, compiled as `mode` says."""
    import kiln

    bench.seed_all(0)
    if model_name == "tiny_train":
        workload = tiny_workload(bench, device)
    else:
        workload = bench.MODELS[model_name].factory(bench.BuildCtx(device, quick, 0))
    model = kiln.compile(workload.model) if mode == "kiln_module" else workload.model
    optimizer = workload.optim_fn(list(workload.model.parameters()))
    step = bench.make_step(workload, model, optimizer, device, bench.COMPILERS["eager"])
    if mode == "kiln_step":
        kiln.config.compiled_autograd = True
        return kiln.compile(step)
    if mode == "torch_step":
        torch._dynamo.config.compiled_autograd = True
        return torch.compile(step)
    return step


def measure(step, device: torch.device, warmup: int, steps: int) -> dict:
    """Compile time (the first step's wall time minus a later step's) and the median step time, in ms."""
    def timed() -> float:
        bench_sync(device)
        start = time.perf_counter()
        step()
        bench_sync(device)
        return (time.perf_counter() - start) * 1000

    first = timed()
    for _ in range(warmup):
        timed()
    times = [timed() for _ in range(steps)]
    median = statistics.median(times)
    return {"first_step_ms": first, "compile_ms": max(first - median, 0.0), "step_ms": median,
            "step_ms_min": min(times)}


def bench_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def worker(args) -> None:
    """One (model, mode) in this process; prints its result as one JSON line."""
    bench = load_bench(args.bench)
    device = torch.device(args.device)
    try:
        step = build(bench, args.models, args.mode, device, args.quick)
        result = measure(step, device, args.warmup, args.steps)
    except Exception as e:  # reported, not fatal: the other modes still run
        result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    print("RESULT " + json.dumps({"model": args.models, "mode": args.mode, **result}), flush=True)


def run_all(args) -> list[dict]:
    results = []
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--models", model,
                   "--device", args.device, "--bench", args.bench, "--warmup", str(args.warmup),
                   "--steps", str(args.steps)] + (["--quick"] if args.quick else [])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
            result = json.loads(line[len("RESULT "):]) if line else {
                "model": model, "mode": mode, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
            results.append(result)
            print(format_row(result), flush=True)
    return results


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:<20} {r['mode']:<12} error: {r['error']}"
    return (f"{r['model']:<20} {r['mode']:<12} step {r['step_ms']:9.2f} ms   compile {r['compile_ms'] / 1000:7.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=DEFAULT_BENCH, help="path of the shared harness models_bench.py")
    parser.add_argument("--models", default="transformer6_train,gpt2_train,vit_b16_train")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="the harness's small sizes")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", help="write the results as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = run_all(args)
    write_json(args.out, {"device": args.device, "torch": torch.__version__, "results": results})


if __name__ == "__main__":
    main()

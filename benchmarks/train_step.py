"""Whole training steps, four ways, compared within one run: step time and compile time.

    eager         the harness's train step as it is
    kiln_module   kiln.compile(model); zero_grad, backward and optimizer.step eager
    kiln_step     kiln.compile(train_step) with kiln.config.compiled_autograd: the forward, the backward
                  (compiled autograd) and the optimizer update (kiln.optim) compiled
    torch_step    torch.compile(train_step) with torch._dynamo.config.compiled_autograd (the reference)

The train step is the harness's (`models_bench.make_step`: zero_grad, autocast forward and loss, backward,
step). Each (model, mode) runs in its own process, under a time limit (`--timeout`): the autograd engine
binds compiled autograd's node functions once per process, so kiln's and torch's compiled autograd cannot
share one, and a configuration that fails, hangs or crashes is recorded as failed while the others run.
The run is strict (KILN_STRICT=1, set by `common`): a kiln fallback fails its configuration.

Per configuration: `step_ms`, the median of synchronized single steps (host and device time of one step);
`back_to_back_ms`, the mean of steps issued without a synchronize between them (as the harness runs them);
`compile_s`, the time the first steps took beyond `step_ms` (compiles may come in the second step too:
torch.compile's optimizer and kiln's SGD with momentum compile the first step and the steady update
separately; kiln's Adam/AdamW make the first step's state and compile only the steady update);
`first_step_s`.

Results go to `benchmarks/results/train_step/<date>_<gpu>_<commit>.json` and `.md` (a table):

    python benchmarks/train_step.py --device cuda --bench /work/shared/bench/models_bench.py \\
        --models transformer6_train,gpt2_train,vit_b16_train
    python benchmarks/train_step.py --dry-run    # CPU, a two-block transformer, 3 steps, results to a temp dir

`tiny_train` is a two-block transformer built here (no harness model needed); `--quick` asks the harness
for its small sizes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from common import load_bench, result_path, write_json

MODES = ("eager", "kiln_module", "kiln_step", "torch_step")
DEFAULT_BENCH = "/work/shared/bench/models_bench.py"
RESULT_PREFIX = "RESULT "


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

    if device.type == "cuda":
        bench.apply_global_settings(cudnn_benchmark=True)
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
    """Step times in ms (see the module docstring); compile time from the first `1 + warmup` steps."""
    def timed() -> float:
        bench_sync(device)
        start = time.perf_counter()
        step()
        bench_sync(device)
        return (time.perf_counter() - start) * 1000

    first = [timed() for _ in range(1 + warmup)]
    times = [timed() for _ in range(steps)]
    median = statistics.median(times)
    bench_sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    bench_sync(device)
    back_to_back = (time.perf_counter() - start) * 1000 / steps
    return {"step_ms": median, "step_ms_min": min(times), "back_to_back_ms": back_to_back,
            "compile_s": sum(max(t - median, 0.0) for t in first) / 1000, "first_step_s": first[0] / 1000}


def bench_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def worker(args) -> None:
    """One (model, mode) in this process; prints its result as one line (RESULT_PREFIX + JSON)."""
    device = torch.device(args.device)
    try:
        bench = load_bench(args.bench)  # tiny_train too: it is built of the harness's TransformerBlock
        step = build(bench, args.models, args.mode, device, args.quick)
        result = measure(step, device, args.warmup, args.steps)
    except Exception as e:  # reported, not fatal: the other modes still run
        result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    print(RESULT_PREFIX + json.dumps({"model": args.models, "mode": args.mode, **result}), flush=True)


def run_one(args, model: str, mode: str) -> dict:
    """One configuration in a child process, within the time limit; its failure is a result too."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--models", model,
           "--device", args.device, "--bench", args.bench, "--warmup", str(args.warmup),
           "--steps", str(args.steps)] + (["--quick"] if args.quick else [])
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "mode": mode, "error": f"timed out after {args.timeout:.0f} s"}
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if line is not None:
        result = json.loads(line[len(RESULT_PREFIX):])
    else:  # the process died (a crash, out of memory): its last words
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        result = {"model": model, "mode": mode, "error": f"exit code {done.returncode}: {last[:300]}"}
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def run_all(args) -> list[dict]:
    configs = [(model, mode) for model in args.models.split(",") for mode in args.modes.split(",")]
    results = []
    for k, (model, mode) in enumerate(configs, 1):
        print(f"[{k}/{len(configs)}] {model} {mode} ...", flush=True)
        result = run_one(args, model, mode)
        results.append(result)
        print(f"[{k}/{len(configs)}] " + format_row(result), flush=True)
    return results


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:<20} {r['mode']:<12} FAILED: {r['error']}"
    return (f"{r['model']:<20} {r['mode']:<12} step {r['step_ms']:9.2f} ms   back-to-back "
            f"{r['back_to_back_ms']:9.2f} ms   compile {r['compile_s']:7.1f} s")


def markdown(meta: dict, results: list[dict]) -> str:
    """The run as a table: per model and mode, the times and the ratios to eager and to kiln_module."""
    lines = [f"# train_step: {meta['device_name']}, {meta['date']}, commit {meta['commit']}", "",
             f"torch {meta['torch']}, {meta['steps']} timed steps after {meta['warmup']} warm-up steps"
             f"{' (quick sizes)' if meta['quick'] else ''}; times in ms, compile in s.", "",
             "| model | mode | step ms | back-to-back ms | compile s | vs eager | vs kiln_module |",
             "|---|---|---|---|---|---|---|"]
    by_key = {(r["model"], r["mode"]): r for r in results}
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mode']} | failed: {r['error'].replace('|', '/')} | | | | |")
            continue
        ratios = []
        for base in ("eager", "kiln_module"):
            ref = by_key.get((r["model"], base), {})
            ratios.append(f"{ref['step_ms'] / r['step_ms']:.2f}x" if "step_ms" in ref else "")
        lines.append(f"| {r['model']} | {r['mode']} | {r['step_ms']:.2f} | {r['back_to_back_ms']:.2f} | "
                     f"{r['compile_s']:.1f} | {ratios[0]} | {ratios[1]} |")
    lines += ["", "Ratios are speedups (reference step time / this step time): above 1x is faster.", ""]
    return "\n".join(lines)


def machine_name(device: torch.device) -> str:
    """A short name of the device for file names: `h100`, `h200`, ..., or `cpu`."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    found = re.search(r"\b([a-z]\d{2,3}[a-z]?)\b", name)
    return found.group(1) if found else re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=here, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=DEFAULT_BENCH, help="path of the shared harness models_bench.py")
    parser.add_argument("--models", default="transformer6_train,gpt2_train,vit_b16_train")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="the harness's small sizes")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the whole run on the CPU: tiny_train, 3 steps, results to a temp dir")
    parser.add_argument("--out-dir", help="where the JSON and markdown go (default benchmarks/results/train_step)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.dry_run:
        args.device, args.models, args.steps, args.warmup = "cpu", "tiny_train", 3, 1
        args.out_dir = args.out_dir or tempfile.mkdtemp(prefix="train_step_dry_run_")
    device = torch.device(args.device)
    meta = {"device": args.device, "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else "CPU", "torch": torch.__version__, "commit": commit(), "quick": args.quick,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "steps": args.steps,
            "warmup": args.warmup, "kiln_strict": os.environ.get("KILN_STRICT")}
    print(f"train_step: {meta['device_name']}, torch {meta['torch']}, commit {meta['commit']}", flush=True)
    results = run_all(args)
    path = result_path("train_step", machine_name(device))
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        path = os.path.join(args.out_dir, os.path.basename(path))
    write_json(path, {**meta, "results": results})
    with open(path[:-len(".json")] + ".md", "w") as f:
        f.write(markdown(meta, results))
    print(f"wrote {path} and {path[:-len('.json')]}.md", flush=True)
    failed = [r for r in results if "error" in r]
    if failed:
        print(f"{len(failed)} of {len(results)} configurations failed", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

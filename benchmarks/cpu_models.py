"""CPU benchmark of kiln's code generator: eager vs torch.compile vs kiln, side by side.

    python benchmarks/cpu_models.py [--quick] [--models ...] [--compilers ...]

Models come from the shared harness (../shared/bench/models_bench.py: mlp_small_bs1,
cnn_fashion_train, transformer6_train), and each (model, compiler) job runs through
its `run_job` in a fresh subprocess (correctness vs an eager copy, cold compile time
= compiler call + first step, median step time). Compilers:

    eager           the model as is
    torch           torch.compile(model)                      (PyTorch's CPU inductor)
    kiln-inductor   torch.compile(model, backend=kiln.inductor) (Dynamo capture, kiln codegen)
    kiln            kiln.compile(model)                       (kiln end to end)

Cold runs use empty cache directories (TORCHINDUCTOR_CACHE_DIR, KILN_CACHE_DIR);
each compiler is then run once more in a second process over the same, now warm,
directories: that is the warm compile time. Results go to
benchmarks/results/cpu_models/<UTC date>_cpu_<commit>.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from common import result_path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT.parent / "shared" / "bench"
MODELS = ["mlp_small_bs1", "cnn_fashion_train", "transformer6_train"]
COMPILERS = ["eager", "torch", "kiln-inductor", "kiln"]


def _register_kiln_inductor(mb) -> None:
    def wrap(model, opts):
        import torch

        import kiln
        return torch.compile(model, backend=kiln.inductor)

    mb.register_compiler("kiln-inductor", desc="torch.compile(model, backend=kiln.inductor)",
                         requires=("kiln",), uses_dynamo=True, infer_ctx="no_grad")(wrap)


def worker(job_json: str) -> None:
    sys.path.insert(0, str(BENCH))
    sys.path.insert(0, str(ROOT))
    import models_bench as mb

    _register_kiln_inductor(mb)
    res = mb.run_job(json.loads(job_json))
    res.get("step_ms", {}).pop("all", None)
    print("RESULT " + json.dumps(mb._sanitize(res), default=mb._json_default))


def run_job(job: dict, env: dict, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--_worker", json.dumps(job)], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"status": "error", "error": (proc.stderr or proc.stdout)[-2000:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--quick", action="store_true", help="the harness's small batches")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for every job (eager, torch and kiln alike); default: unset")
    p.add_argument("--out", default=None)
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker:
        worker(args._worker)
        return 0
    models, compilers = args.models.split(","), args.compilers.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="kiln_bench_") as tmp:
        for model in models:
            for comp in compilers:
                caches = Path(tmp) / f"{model}-{comp}"
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                           KILN_CACHE_DIR=str(caches / "kiln"), PYTHONPATH=str(ROOT))
                if args.threads:
                    env["OMP_NUM_THREADS"] = str(args.threads)
                job = dict(model=model, compiler=comp, device="cpu", quick=args.quick, seed=0,
                           steps=args.steps, warmup=args.warmup, check_steps=3, check=comp != "eager",
                           cudnn_benchmark=False, compiler_opts={}, tol_fp32=5e-3, tol_bf16=5e-2)
                cold = run_job(job, env, args.timeout)
                entry = {"model": model, "compiler": comp, "cold": cold}
                if comp != "eager" and cold.get("status") == "ok":
                    warm = run_job(dict(job, check=False, steps=3, warmup=0), env, args.timeout)
                    entry["warm_compile_s"] = warm.get("compile_s")
                results.append(entry)
                _print_row(entry)
    summary = _summarize(results)
    out = Path(args.out or result_path("cpu_models", "cpu"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "load_average": os.getloadavg(), "threads": args.threads},
        "summary": summary, "results": results}, indent=1, default=str))
    print(f"\nwrote {out}")
    print(json.dumps(summary, indent=1))
    return 0


def _print_row(e: dict) -> None:
    c = e["cold"]
    step = c.get("step_ms", {}).get("median")
    corr = c.get("correctness", {})
    print(f"{e['model']:<22} {e['compiler']:<14} {c.get('status'):<6} corr={corr.get('status', '-'):<5} "
          f"metric={corr.get('metric')} step_ms={step} cold_compile_s={c.get('compile_s')} "
          f"warm_compile_s={e.get('warm_compile_s')} {c.get('error') or ''}", flush=True)


def _summarize(results: list) -> dict:
    out = {}
    by = {(r["model"], r["compiler"]): r for r in results}
    for (model, comp), r in by.items():
        c = r["cold"]
        eager = by.get((model, "eager"), {}).get("cold", {})
        step, base = c.get("step_ms", {}).get("median"), eager.get("step_ms", {}).get("median")
        torch_step = by.get((model, "torch"), {}).get("cold", {}).get("step_ms", {}).get("median")
        eager_first = (eager.get("pre_calls_s") or [None])[0]
        out.setdefault(model, {})[comp] = {
            "status": c.get("status"), "correctness": c.get("correctness", {}).get("status"),
            "step_ms_median": step, "speedup_vs_eager": (base / step) if step and base else None,
            "speedup_vs_torch_compile": (torch_step / step) if step and torch_step else None,
            "cold_compile_s": c.get("compile_s"), "warm_compile_s": r.get("warm_compile_s"),
            # compile_s includes the first step; minus eager's first step it is the compiler's own time
            "cold_compile_minus_eager_first_step_s": _minus(c.get("compile_s"), eager_first),
            "warm_compile_minus_eager_first_step_s": _minus(r.get("warm_compile_s"), eager_first),
            "error": c.get("error"),
        }
    return out


def _minus(a, b):
    return a - b if a is not None and b is not None else None


if __name__ == "__main__":
    sys.exit(main())

"""The fuzzer's command line.

    python -m tests.fuzz --programs 2000 --backend inductor --workers 16 --out summary.json
    python -m tests.fuzz --programs 300 --backend all --workers 2          # eager, aot_eager and inductor
    python -m tests.fuzz --programs 400 --device cpu-triton --workers 2     # GPU programs, Triton kernels, no GPU
    python -m tests.fuzz --replay 123 --backend aot_eager                  # print program 123 and its outcome
    python -m tests.fuzz --minimize 123 --backend inductor [--isolate]     # print its smallest failing form
    python tests/fuzz ...        # the same, where an installed package named `tests` shadows this directory

A long run executes each program in a worker subprocess (pool.py), so a program that kills its process
counts as "died" and the run goes on. The summary gives counts per backend and outcome, counts per
failure kind, and for each failure its seed, backend, first line and program; and the programs where a
graph or kernel fell back to ATen (values right, compiled code missing: `fell_back`, `fallbacks`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if not __package__:  # run as `python tests/fuzz`: bind `tests` to this repository's directory, not an installed one
    import types
    _root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(_root))
    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(_root / "tests")]

from tests.fuzz.targets import DEVICES, environment, program_device  # noqa: E402 - after binding `tests`

BACKENDS = ["eager", "aot_eager", "inductor"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--programs", type=int, default=100, help="programs per backend")
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument("--backend", default="inductor", help="eager, aot_eager, inductor, a comma list, or all")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=DEVICES,
                   help="where inputs live and which kernels run (cpu-triton: Triton's, interpreted on the CPU)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one program may take before it counts as died")
    p.add_argument("--out", help="write the JSON summary here")
    p.add_argument("--budget", type=float, help="seconds: start no program after this (the summary counts those run)")
    p.add_argument("--replay", type=int, metavar="SEED", help="print one program and its outcome, in this process")
    p.add_argument("--minimize", type=int, metavar="SEED", help="print the smallest program failing like SEED")
    p.add_argument("--isolate", action="store_true", help="minimize in a subprocess (for programs that die)")
    p.add_argument("--worker", nargs=2, metavar=("BACKEND", "DEVICE"), help=argparse.SUPPRESS)
    p.add_argument("--serve-reruns", action="store_true", help=argparse.SUPPRESS)  # conditioning.py
    return p.parse_args(argv)


def backends_of(spec: str) -> list[str]:
    return BACKENDS if spec == "all" else spec.split(",")


def long_run(args) -> dict:
    """Every (backend, seed) through a pool of worker subprocesses; the JSON summary."""
    from tests.fuzz.pool import Worker

    jobs = [(b, s) for b in backends_of(args.backend) for s in range(args.start, args.start + args.programs)]
    results, lock, started = [], threading.Lock(), time.time()
    local = threading.local()
    workers = []

    def run(job):
        backend, seed = job
        if args.budget and time.time() - started > args.budget:
            return
        pool = getattr(local, "workers", None)
        if pool is None:
            pool = local.workers = {}
        if backend not in pool:
            pool[backend] = Worker(backend, args.device, args.timeout)
            with lock:
                workers.append(pool[backend])
        result = {"seed": seed, "backend": backend, **pool[backend].run({"seed": seed})}
        with lock:
            results.append(result)
            if result["status"] != "ok":
                print(f"{backend} seed {seed}: {result['status']} [{result['kind']}] {result['message'][:160]}",
                      flush=True)
            if result.get("fallback"):
                print(f"{backend} seed {seed}: fell back: {result['fallback'][:160]}", flush=True)
            if len(results) % 50 == 0:
                print(f"-- {len(results)}/{len(jobs)} programs, {time.time() - started:.0f} s", flush=True)

    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(run, jobs))
    for w in workers:
        w.close()
    return summarize(results, args, time.time() - started)


def summarize(results: list[dict], args, seconds: float) -> dict:
    per_backend = {}
    for backend in backends_of(args.backend):
        mine = [r for r in results if r["backend"] == backend]
        per_backend[backend] = {
            "programs": len(mine),
            "counts": {s: sum(r["status"] == s for r in mine)
                       for s in ("ok", "ill-conditioned", "wrong", "crash", "died")},
            "kinds": dict(Counter(f"{r['status']}:{r['kind']}" for r in mine if r["status"] != "ok").most_common()),
            "fell_back": sum(bool(r.get("fallback")) for r in mine),  # a graph or kernel ran through ATen
        }
    failures = [{"seed": r["seed"], "backend": r["backend"], "status": r["status"], "kind": r["kind"],
                 "message": r["message"].split("\n")[0][:300], "program": r.get("program", "")}
                for r in sorted(results, key=lambda r: (r["backend"], r["seed"])) if r["status"] != "ok"]
    fallbacks = [{"seed": r["seed"], "backend": r["backend"], "fallback": r["fallback"]}
                 for r in sorted(results, key=lambda r: (r["backend"], r["seed"])) if r.get("fallback")]
    return {"command": "python -m tests.fuzz " + " ".join(sys.argv[1:]), "device": args.device,
            "seeds": [args.start, args.start + args.programs], "programs_run": len(results),
            "seconds": round(seconds), "backends": per_backend,
            "failures": failures, "fallbacks": fallbacks}


def replay(args) -> None:
    from tests.fuzz.compare import run_program
    from tests.fuzz.programs import generate

    source = generate(args.replay, program_device(args.device))
    print(source)
    for backend in backends_of(args.backend):
        outcome = run_program(source, backend, args.device)
        print(f"{backend}: {outcome.first_line()}")
        if outcome.fallback:
            print(f"{backend}: fell back: {outcome.fallback}")


def minimize_seed(args) -> None:
    from tests.fuzz.compare import Outcome, run_program
    from tests.fuzz.minimize import minimize
    from tests.fuzz.pool import Worker
    from tests.fuzz.programs import generate

    source = generate(args.minimize, program_device(args.device))
    for backend in backends_of(args.backend):
        if args.isolate:
            worker = Worker(backend, args.device, args.timeout)

            def run(text, worker=worker):
                result = worker.run({"source": text})
                return Outcome(result["status"], result["kind"], result["message"])
        else:
            def run(text, backend=backend):
                return run_program(text, backend, args.device)
        small, outcome = minimize(source, run, note=f"seed {args.minimize}, backend {backend}")
        if args.isolate:
            worker.close()
        print(small)
        print(f"# {backend}: {outcome.first_line()}\n")


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.update(environment(args.device))  # before torch loads, here and in every worker
    if args.worker:
        from tests.fuzz.pool import serve
        return serve(*args.worker)
    if args.serve_reruns:
        from tests.fuzz.conditioning import serve_reruns
        return serve_reruns()
    if args.replay is not None:
        return replay(args)
    if args.minimize is not None:
        return minimize_seed(args)
    summary = long_run(args)
    for backend, info in summary["backends"].items():
        print(f"{backend}: {info['counts']}  {info['kinds']}  fell back: {info['fell_back']}")
    print(f"{summary['seconds']} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(summary, fh, indent=1)


if __name__ == "__main__":
    main()

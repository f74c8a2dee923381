"""Warm start: how long a new process takes to compile a model that was compiled before, kiln next to torch.compile.

    python benchmarks/warm_start.py [--device cpu|cuda] [--quick] [--models ...] [--compilers kiln torch]

For each model and compiler, each run in a fresh process (imports of torch and of the compiler's modules, and
building the model, not counted):

    cold        empty cache directories (KILN_CACHE_DIR; TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR)
    warm        a new process over the directories the cold run filled
    artifacts   a new process with empty directories that first loads the blob the cold run saved
                (kiln.save_cache_artifacts / torch.compiler.save_cache_artifacts), load time included

`first_step_s` is the compile call plus the first step (forward, and for training backward and optimizer);
`compile_s` subtracts one steady step (the median of the next three) from it: the time the compile costs.
`compile_cpu_s` is the same in CPU seconds of the process (`time.process_time`: every thread, not child processes
such as a C++ compiler): on a machine other jobs load, wall seconds stretch with the load and CPU seconds much
less, so compare CPU seconds there.
With --repeat N the warm and artifacts cells run N processes each and report their median (`runs` and
`cpu_runs` list each process's compile_s and compile_cpu_s): on a shared machine one process's time varies by a
factor of two.
torch.compile runs with its defaults, its FX graph cache and AOTAutograd cache on. `--compilers eager` adds one
row per model: eager's own first step less a steady one, what any first step costs beyond a steady one (CUDA
libraries' first calls, cuDNN's search for convolution algorithms with `cudnn.benchmark` on, as the zoo's
workloads run), which every compiler's `compile_s` includes.

Models: on the CPU (default) the shared harness's CPU-sized models at --quick sizes and kiln's bundled example
(kiln/examples/vit_train.py, a training step); with --device cuda the harness's GPU models
(../shared/bench/models_bench.py, --bench to point elsewhere) and three of kiln's zoo (benchmarks/zoo; any zoo
workload is named `zoo:<workload>`, as `--models zoo:bert_train_bf16`). Results go to
benchmarks/results/warm_start/<date>_<device>_<commit>.json and a markdown table on stdout.

--profile DIR runs each process's timed part (loading the artifacts, the compile call and the first step) under
cProfile and writes DIR/<model>-<compiler>-<mode>-<k>.pstats, with the 60 costliest functions (cumulative and own
time) beside it in a .txt: where a warm process's seconds go. On Python 3.12 and later cProfile sees every thread
(the Triton precompile pool's too); on 3.11 only the main thread. The profiler slows Python-heavy parts, so the
timings of a profiled run are not the benchmark's.

Each row also says what could make a warm process's steady step differ from a cold one's: `step_cpu_s` (the CPU
seconds of one steady step, every thread of the process), `background` (its other threads and child processes
then) and, for kiln, `kiln` (Triton kernels loaded from kiln's cache without Triton's JIT, whether the build workers
started, launches of the steady steps that missed a launcher's fast path, and `made`: what the process traced or
compiled instead of taking it from the cache).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ZOO, compiled_by, result_path, zoo_module, zoo_workload

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BENCH = ROOT.parent / "shared" / "bench" / "models_bench.py"
CPU_MODELS = ["mlp_small_bs1", "cnn_fashion_train", "transformer6_train", "kiln_vit_train"]
GPU_MODELS = ["vit_b16_train", "gpt2_train", "bert_infer_bf16", "resnet50_infer_bs1", f"{ZOO}llama_train_bf16",
              f"{ZOO}timm_convnext_infer_fp32_bs64", f"{ZOO}t5_train_bf16"]
MODES = ["cold", "warm", "artifacts"]


# ----------------------------------------------------------------------------- the worker (one process, one run)


def _example_workload(bench, device):
    """kiln's bundled example as a harness workload: a TinyViT training step with SGD."""
    import torch

    from kiln.examples.vit_train import TinyViT

    gen = torch.Generator().manual_seed(0)
    images, labels = torch.randn(32, 3, 32, 32, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    return bench.Workload(kind="train", model=TinyViT().to(device), args=(images.to(device),),
                          target=labels.to(device), loss_fn=torch.nn.functional.cross_entropy,
                          optim_fn=lambda p: torch.optim.SGD(p, lr=0.01))


def _import(compiler: str) -> None:
    """Import the compiler's modules before the clock starts: a server imports them once, whatever it compiles.
    torch._dynamo for both: torch's ShapeEnv (which kiln's capture uses) imports it on first use."""
    import torch._dynamo  # noqa: F401
    if compiler == "kiln":
        import kiln  # noqa: F401
    elif compiler == "torch":
        import torch._inductor.compile_fx  # noqa: F401


def _load_artifacts(compiler: str, blob: bytes) -> None:
    if compiler == "kiln":
        import kiln
        kiln.load_cache_artifacts(blob)
    else:
        import torch
        torch.compiler.load_cache_artifacts(blob)


def _save_artifacts(compiler: str) -> bytes | None:
    if compiler == "eager":
        return None
    if compiler == "kiln":
        import kiln
        return kiln.save_cache_artifacts()
    import torch
    saved = torch.compiler.save_cache_artifacts()
    return saved[0] if saved else None


def _harness_model(job: dict, device):
    """The shared harness's model `job["model"]` (or kiln's bundled example): a function that compiles it and
    returns its step, and the harness (for its sync)."""
    from common import load_bench

    bench = load_bench(job["bench"])
    bench.seed_all(0)
    if job["model"] == "kiln_vit_train":
        workload = _example_workload(bench, device)
    else:
        workload = bench.MODELS[job["model"]].factory(bench.BuildCtx(device, job["quick"], 0))

    def compile_and_step():
        fn = compiled_by(job["compiler"], workload.model)
        optimizer = workload.optim_fn(bench.params_for_optimizer(fn, workload.model)) \
            if workload.kind == "train" else None
        return bench.make_step(workload, fn, optimizer, device, bench.COMPILERS["eager"])
    return compile_and_step


def _zoo_model(job: dict, device):
    """The zoo's workload `job["model"]` (common.zoo_workload): a function that compiles it and returns a step on
    one fixed batch."""
    workload, model, inputs = zoo_workload(job["model"], device)
    make_step = zoo_module().make_step

    def compile_and_step():
        step = make_step(workload, compiled_by(job["compiler"], model), model)
        return lambda: step(inputs)
    return compile_and_step


def worker(job: dict) -> dict:
    """Build the model, then time: loading the artifacts (mode "artifacts"), the compile call and the first
    step, and three more steps. Saves the artifacts after a cold run."""
    import torch

    sys.path.insert(0, str(ROOT))
    device = torch.device(job["device"])
    compile_and_step = (_zoo_model if job["model"].startswith(ZOO) else _harness_model)(job, device)
    _import(job["compiler"])
    result = {"load_s": 0.0}
    profile = cProfile.Profile() if job.get("profile") else None
    if profile is not None:
        profile.enable()
    start, start_cpu = time.perf_counter(), time.process_time()
    if job["mode"] == "artifacts":
        _load_artifacts(job["compiler"], Path(job["blob"]).read_bytes())
        result["load_s"] = time.perf_counter() - start
    step = compile_and_step()
    step()
    _sync(device)
    result["first_step_s"] = time.perf_counter() - start
    result["first_step_cpu_s"] = time.process_time() - start_cpu
    if profile is not None:
        profile.disable()
        _write_profile(profile, Path(job["profile"]))
    slow_before = _slow_launches()
    steady, steady_cpu = [], []
    for _ in range(3):
        t, c = time.perf_counter(), time.process_time()
        step()
        _sync(device)
        steady.append(time.perf_counter() - t)
        steady_cpu.append(time.process_time() - c)
    result["step_s"] = statistics.median(steady)
    result["step_cpu_s"] = statistics.median(steady_cpu)  # every thread of the process: background work shows
    result["background"] = _background()
    if job["compiler"] == "kiln":
        result["kiln"] = _kiln_paths(_slow_launches() - slow_before)
    result["compile_s"] = result["first_step_s"] - result["step_s"]
    result["compile_cpu_s"] = result["first_step_cpu_s"] - result["step_cpu_s"]
    if job["mode"] == "cold":
        _finish_background_builds(job["compiler"])
        blob = _save_artifacts(job["compiler"])
        if blob:
            Path(job["blob"]).write_bytes(blob)
    return result


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _finish_background_builds(compiler: str) -> None:
    """A cold kiln process leaves the guards' C++ extension building in a detached process (kiln/runtime/
    detached_build.py: twenty seconds of the compiler on an idle core). It is waited for, untimed, before the
    artifacts are saved and the process exits: the warm and artifacts processes then start over a complete cache
    and blob, as on a machine that compiled the model before, not beside a compiler still running on one of the
    machine's cores."""
    if compiler == "kiln":
        from kiln.capture import tensor_checks
        tensor_checks.wait()


def _slow_launches() -> int:
    launch = sys.modules.get("kiln.codegen.triton.launch")
    return launch.stats["slow_launches"] if launch is not None else 0


def _background() -> dict:
    """What else runs in the process during the steady steps (a cold and a warm process should not differ): its
    threads besides the main one, and its child processes (Triton build workers, compilers)."""
    import threading

    children = 0
    for task in Path("/proc/self/task").glob("*/children"):
        children += len(task.read_text().split())
    return {"threads": sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()),
            "children": children}


def _kiln_paths(slow_launches: int) -> dict:
    """How kiln's kernels were loaded and launched: Triton kernels loaded from kiln's cache without Triton's JIT
    (kiln/runtime/triton_binaries.py), whether the build workers started, the launches of the three steady
    steps that missed a launcher's fast path (kiln/codegen/triton/launch.py), and what the process compiled
    instead of taking it from the cache (`made`: AOT variants traced, ATen graphs compiled, keys or products the
    cache could not describe; a warm process should show none)."""
    from kiln.runtime import graph_cache

    binaries = sys.modules.get("kiln.runtime.triton_binaries")
    workers = sys.modules.get("kiln.codegen.triton.build_workers")
    stats = graph_cache.folder_stats
    made = {"traces": stats["aot"].get("traces"), "compiles": stats["graphs"].get("compiles"),
            "uncacheable": stats["graphs"]["uncacheable"] + stats["aot"]["uncacheable"]}
    return {"binaries": dict(binaries.stats) if binaries else {},
            "build_workers": getattr(workers, "_pool", None) is not None, "slow_launches": slow_launches,
            "made": made}


def _write_profile(profile: cProfile.Profile, path: Path) -> None:
    """`path`.pstats (for pstats or snakeviz) and `path`.txt: the 60 costliest functions, cumulative and own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.dump_stats(path.with_suffix(".pstats"))
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(60)
    path.with_suffix(".txt").write_text(text.getvalue())


# ----------------------------------------------------------------------------- the driver


def _run(job: dict, caches: Path, timeout: float) -> dict:
    """One worker process for `job`, with the cache directories of its mode."""
    fresh = job["mode"] != "warm"
    where = caches / f"{job['model']}-{job['compiler']}-{job['mode'] if fresh else 'cold'}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), KILN_CACHE_DIR=str(where / "kiln"),
               TORCHINDUCTOR_CACHE_DIR=str(where / "inductor"), TRITON_CACHE_DIR=str(where / "triton"))
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (proc.stderr or proc.stdout)[-1500:]}


def _profiled(job: dict, folder: str | None, k: int) -> dict:
    """`job`, told where to write its profile (--profile) as the k-th process of its cell."""
    if folder is None:
        return job
    name = f"{job['model']}-{job['compiler']}-{job['mode']}-{k}"
    return {**job, "profile": str(Path(folder).resolve() / name)}


def _median_of(runs: list[dict]) -> dict:
    """The run of median compile_s (an error if any run failed), with every run's compile_s and compile_cpu_s when
    there were several."""
    failed = next((r for r in runs if "error" in r), None)
    if failed is not None or len(runs) == 1:
        return failed or runs[0]
    ordered = sorted(runs, key=lambda r: r["compile_s"])
    return {**ordered[len(ordered) // 2], "runs": [round(r["compile_s"], 3) for r in runs],
            "cpu_runs": [round(r["compile_cpu_s"], 3) for r in runs]}


def _table(rows: list[dict]) -> str:
    lines = ["| model | compiler | mode | compile_s | compile_cpu_s | first_step_s | load_s | step_ms | step_cpu_ms | "
             "kiln made |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['compiler']} | {r['mode']} | error | | | | | | |")
            continue
        made = r.get("kiln", {}).get("made")
        lines.append(f"| {r['model']} | {r['compiler']} | {r['mode']} | {r['compile_s']:.2f} | "
                     f"{r['compile_cpu_s']:.2f} | {r['first_step_s']:.2f} | {r['load_s']:.3f} | "
                     f"{r['step_s'] * 1000:.1f} | {r.get('step_cpu_s', 0) * 1000:.1f} | "
                     f"{' '.join(f'{k} {v}' for k, v in made.items()) if made else ''} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", nargs="*")
    p.add_argument("--compilers", nargs="*", default=["kiln", "torch"])
    p.add_argument("--quick", action="store_true", help="the harness's small sizes (the CPU default)")
    p.add_argument("--bench", default=str(DEFAULT_BENCH), help="path of the shared harness models_bench.py")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--repeat", type=int, default=1, help="processes per warm and artifacts cell (their median)")
    p.add_argument("--out")
    p.add_argument("--profile", metavar="DIR", help="write each process's cProfile stats (a .pstats and .txt each)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))))
        return
    models = args.models or (CPU_MODELS if args.device == "cpu" else GPU_MODELS)
    quick = args.quick or args.device == "cpu"
    load_at_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln_warm_start_") as tmp:
        caches = Path(tmp)
        for model in models:
            for compiler in args.compilers:
                blob = caches / f"{model}-{compiler}.blob"
                for mode in MODES if compiler != "eager" else ["cold"]:
                    if mode == "artifacts" and not blob.exists():
                        continue
                    job = {"model": model, "compiler": compiler, "mode": mode, "device": args.device,
                           "quick": quick, "bench": args.bench, "blob": str(blob)}
                    repeat = 1 if mode == "cold" else args.repeat
                    runs = [_run(_profiled(job, args.profile, k), caches, args.timeout) for k in range(repeat)]
                    rows.append({"model": model, "compiler": compiler, "mode": mode, **_median_of(runs)})
                    print(_table(rows[-1:]).splitlines()[-1], flush=True)
    out = Path(args.out or result_path("warm_start", args.device))
    out.write_text(json.dumps({"command": " ".join(sys.argv), "device": args.device, "quick": quick,
                               "threads": os.environ.get("OMP_NUM_THREADS"),
                               "load_average": [load_at_start, os.getloadavg()], "rows": rows}, indent=1))
    print(_table(rows))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()

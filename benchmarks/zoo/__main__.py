"""The model zoo: eager, torch.compile and kiln on the workloads of `workloads.py`, on one GPU or sharded over a host's.

    python benchmarks/zoo --list
    python benchmarks/zoo [--workloads a,b | --shard 0/4] [--compilers eager,torch,kiln] [--out run.json]
    python benchmarks/zoo --jobs 3                              # three pairs compile side by side, time alone
    python benchmarks/zoo --table run.json [run2.json ...]      # the README table of one or more runs

Each (workload, compiler) pair runs in its own subprocess with empty compile caches, so compile times are cold
and a crash or hang costs one pair. kiln runs with `KILN_STRICT=1` (set by benchmarks/common.py; `KILN_STRICT=0`
measures anyway): a fallback fails the workload instead of hiding in its step time. Per pair the run records:
- `status`: ok, wrong (compiled result off eager's beyond the tolerance), failed (raised, timed out), skipped
  (the model's library is missing);
- `ms`: the median of CUDA-event-timed steps after warm-up, once the compiler's background work is done (kiln's C++
  tensor guards, built once per machine: `common.settled`);
- `compile_s`: wall time of the compiler call plus the first step (for training the whole first step), less
  `stopped_s`, the time other pairs' timed sections had this pair stopped (below);
- `peak_mb`: peak allocated GPU memory from before the compiler call to the end of the timed steps;
- `error`: the relative error against an eager copy with the same weights on the same inputs (the loss of the first
  step for training; the output for inference). Dropout is off, so the two compare exactly;
- for kiln, `fallbacks` (by kind; strict makes any fallback a failure), `graph_breaks` (breaks torch.compile
  takes too, by reason), `native_guards` (its tensor guards ran in C++, not Python), and `compile_stages_s`:
  where the compile's wall time (`compile_s` + `stopped_s`) went (capture, autograd, lowering, scheduling,
  codegen, build with its Triton compiles, and the rest: imports and the first step's run);
- with `--profile`, `profile`: where a step's GPU time goes (kernel kinds, launch gaps, the longest kernel
  families; see benchmarks/gpu_profile.py), and `host`: the host's side of a step (`host_ms`, the wall time to
  issue one step with the GPU idle before it and not waited for after; `step_ms` with the wait) and, for the
  compilers, the Python functions a few steps spend the most own time in (cProfile).

With `--jobs N`, N pairs run at once: their compiles share the machine's cores (so `compile_s` is a contended
wall time, recorded with the run's `jobs`), and while one pair runs its timed steps every other process of the run
(pairs and their compile workers) is stopped (SIGSTOP), so step times are measured with the machine to
themselves. A pair that runs out of GPU
memory beside the others runs again alone.

With `--gpus N` the run is sharded over the host's first N GPUs (shard i on GPU i, pinned to its own N-th of the
cores), and the timing lock and the stopping above span all shards: a timed step has the whole host to itself,
as in a one-GPU run, while the shards' compiles overlap. One JSON holds every shard's records (with `shard`).

    python benchmarks/zoo --gpus 4 --jobs 4 --timeout 400
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import cProfile
import fcntl
import io
import json
import math
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import torch  # noqa: E402
from gpu_profile import profile_steps  # noqa: E402
from host_profile import step_times  # noqa: E402

from common import compiled, cuda_time, result_path, settled, write_json  # noqa: E402
from workloads import WORKLOADS, gpu_settings, make_step, without_dropout  # noqa: E402

TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 5e-2}  # fp32 matmuls run in TF32, as in the shared harness
COMPILERS = ("eager", "torch", "kiln")
MODEL_LIBRARIES = ("transformers", "timm", "torchvision")


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    if got.shape != want.shape or not torch.isfinite(got).all():
        return math.inf
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()


@contextlib.contextmanager
def timing_lock():
    """The run's timing lock (`ZOO_TIMING_LOCK`, set by a run with --jobs > 1) held; yields whether there is one
    (a run of one pair at a time has none)."""
    path = os.environ.get("ZOO_TIMING_LOCK")
    if not path:
        yield False
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_alone():
    """Run a timed section with the machine to itself: under the run's timing lock, with every other process of
    the run stopped meanwhile (SIGSTOP, then SIGCONT): the other pairs and their compile workers, also those that
    start sessions of their own. Neither their kernels nor their compiles' host work then shares the step's time.
    A no-op for a run of one pair at a time."""
    with timing_lock() as held:
        others = other_processes_of_the_run(int(os.environ["ZOO_RUN_PID"])) if held else []
        start = time.monotonic()
        try:
            signal_processes(others, signal.SIGSTOP)
            yield
        finally:
            try:
                if held:  # the others' compile clocks ran meanwhile: `stopped_during` subtracts this section
                    with open(os.environ["ZOO_TIMING_LOCK"] + ".sections", "a") as sections:
                        sections.write(f"{os.getpid()} {start} {time.monotonic()}\n")
            finally:
                signal_processes(others, signal.SIGCONT)


def stopped_during(start: float, end: float) -> float:
    """Seconds of the monotonic-clock interval [start, end] in which another pair's timed section had this
    process stopped (`machine_alone`): a compile's wall time less these is what it took."""
    path = os.environ.get("ZOO_TIMING_LOCK", "") + ".sections"
    if not os.path.exists(path):
        return 0.0
    total = 0.0
    with open(path) as sections:
        for line in sections:
            pid, begun, ended = line.split()
            if int(pid) != os.getpid():
                total += max(0.0, min(end, float(ended)) - max(start, float(begun)))
    return total


def other_processes_of_the_run(root: int) -> list[int]:
    """Every descendant of the run's process `root` outside this process's own line (itself, its ancestors and
    its descendants), read from /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])

    def line(pid: int) -> list[int]:
        chain = [pid]
        while chain[-1] in parent and chain[-1] != root:
            chain.append(parent[chain[-1]])
        return chain

    mine = os.getpid()
    return [pid for pid in parent if pid != root and root in line(pid)
            and mine not in line(pid) and pid not in line(mine)]


def signal_processes(pids, signum) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def run_job(name: str, compiler: str, profile: bool = False) -> dict:
    """Build, check and time one workload under one compiler (in this process)."""
    workload = WORKLOADS[name]
    gpu_settings()
    device = torch.device("cuda")
    torch.manual_seed(0)
    train = workload.task == "train"
    model, make_inputs = workload.build(workload.batch, device, train)
    without_dropout(model)
    model.train(train)
    if not train:
        model.to(workload.dtype)
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    inputs = [make_inputs(gen) for _ in range(3)]
    if not train:
        inputs = [tuple(x.to(workload.dtype) if x.is_floating_point() else x for x in ins) for ins in inputs]

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.monotonic()
    fn = compiled(model, compiler)
    step = make_step(workload, fn, model)
    got = step(inputs[0])
    torch.cuda.synchronize()
    end = time.monotonic()
    stopped_s = stopped_during(start, end)
    compile_s = end - start - stopped_s
    stages = compile_stages(fn, end - start) if compiler == "kiln" else None
    want = make_step(workload, reference, reference)(inputs[0])
    error = relative_error(got if torch.is_tensor(got) else got[0], want if torch.is_tensor(want) else want[0])

    settled(compiler)
    calls = iter(range(10**9))
    with machine_alone():
        ms = cuda_time(lambda: step(inputs[next(calls) % len(inputs)]), warmup=3, iters=20)
        status = "ok" if error <= TOLERANCE[workload.dtype] else "wrong"
        record = {"workload": name, "compiler": compiler, "status": status, "ms": ms, "compile_s": compile_s,
                  "stopped_s": stopped_s,
                  "peak_mb": torch.cuda.max_memory_allocated() / 2**20, "error": error}
        if stages is not None:
            record["compile_stages_s"] = stages
        if profile:
            record["profile"] = profile_steps(lambda: step(inputs[next(calls) % len(inputs)]), steps=3, warmup=1)
            record["host"] = host_profile(lambda: step(inputs[next(calls) % len(inputs)]), compiler != "eager")
    if compiler == "kiln":  # under KILN_STRICT=1 a fallback raises, so these count only what strict lets pass
        import kiln
        record["fallbacks"] = kiln.fallbacks.counts()
        record["graph_breaks"] = dict(kiln.fallbacks.breaks)
        from kiln.capture import tensor_checks
        record["native_guards"] = tensor_checks.available() is not None  # else its guards checked tensors in Python
    return record


def host_profile(step, with_functions: bool, steps: int = 10) -> dict:
    """The host's side of a step: a step whose host time exceeds its GPU time (`host_ms` near `step_ms`) is
    bound by the Python that issues it, which the GPU profile shows only as gaps. With `with_functions`, also the
    top functions by own time over a few steps (cProfile's clock slows each Python call, so its totals exceed
    `host_ms`; read it for proportions)."""
    host_ms, step_ms = step_times(step, steps)
    record = {"host_ms": host_ms, "step_ms": step_ms}
    if with_functions:
        profiler = cProfile.Profile()
        torch.cuda.synchronize()
        profiler.enable()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        record["functions_3_steps"] = text.getvalue()[-6000:]
    return record


def compile_stages(fn, wall_s: float) -> dict[str, float]:
    """Seconds of kiln's compile of `fn` (what kiln.compile returned) by stage, as `python -m kiln run`'s report
    sums them (capture, autograd, lowering, scheduling, codegen, build: `build` holds the Triton compiles), and
    `rest`: the rest of `wall_s` (importing kiln, running the first step, the optimizer's step)."""
    import kiln
    from kiln.debug import report

    total: dict[str, float] = {}
    for region in report.collect([kiln.api.context_of(fn)]):
        for stage, seconds in region.stages.items():
            total[stage] = total.get(stage, 0.0) + seconds
    total["rest"] = wall_s - sum(total.values())
    return {stage: round(seconds, 3) for stage, seconds in total.items()}


def spawn_job(name: str, compiler: str, timeout: float, profile: bool = False) -> dict:
    """Run one job in a fresh process (its own process group) with empty caches; a crash or timeout becomes a
    failed record."""
    with tempfile.TemporaryDirectory(prefix="zoo-") as caches:
        env = dict(os.environ, KILN_CACHE_DIR=f"{caches}/kiln",
                   TORCHINDUCTOR_CACHE_DIR=f"{caches}/inductor", TRITON_CACHE_DIR=f"{caches}/triton")
        command = [sys.executable, HERE, "--_job", name, "--compilers", compiler] + ["--profile"] * profile
        with started(command, env) as job:
            try:
                stdout, stderr = job.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.pid, signal.SIGKILL)
                job.communicate()
                return {"workload": name, "compiler": compiler, "status": "failed",
                        "reason": f"timeout {timeout:.0f} s"}
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (stderr or stdout).strip().splitlines()[-3:]
    return {"workload": name, "compiler": compiler, "status": "failed", "reason": " | ".join(tail)[-600:]}


@contextlib.contextmanager
def started(command: list[str], env: dict):
    """The job's process, in a process group of its own (a timeout kills its workers too), started under the
    timing lock (a timed section that has stopped the run's processes never misses it); every process of the
    run is continued when it ends, in case it ended while it had them stopped."""
    with timing_lock() as held:
        job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        yield job
    finally:
        if held:
            stopped = set(other_processes_of_the_run(os.getpid()))  # this process's jobs and their workers
            stopped |= set(other_processes_of_the_run(int(os.environ["ZOO_RUN_PID"])))  # and a host's other shards
            signal_processes(stopped, signal.SIGCONT)


def job_main(name: str, compiler: str, profile: bool) -> None:
    """The subprocess side: print one JSON record (library missing -> skipped; a raise -> failed)."""
    try:
        record = run_job(name, compiler, profile)
    except ImportError as e:  # the model's library is missing: skipped; anything else missing is a failure
        status = "skipped" if e.name in MODEL_LIBRARIES else "failed"
        record = {"workload": name, "compiler": compiler, "status": status, "reason": str(e)}
    except Exception as e:  # the record says what failed; the parent keeps going
        record = {"workload": name, "compiler": compiler, "status": "failed",
                  "reason": f"{type(e).__name__}: {e}"[:600]}
    print(json.dumps(record), flush=True)


def table(records: list[dict]) -> str:
    """The README table: one row per workload, eager's ms and each compiler's speedup, compile time and memory."""
    by = {(r["workload"], r["compiler"]): r for r in records}
    names = list(dict.fromkeys(r["workload"] for r in records))
    lines = ["| workload | eager ms | torch.compile | kiln | torch compile s | kiln compile s | kiln peak vs eager |"
             " kiln status |", "|---|---|---|---|---|---|---|---|"]
    ratios = {"torch": [], "kiln": []}
    for name in names:
        eager = by.get((name, "eager"), {})
        cells = [name, f"{eager['ms']:.2f}" if eager.get("status") == "ok" else eager.get("status", "-")]
        for compiler in ("torch", "kiln"):
            r = by.get((name, compiler), {})
            if r.get("status") == "ok" and eager.get("status") == "ok":
                ratio = eager["ms"] / r["ms"]
                ratios[compiler].append(ratio)
                cells.append(f"{ratio:.2f}x")
            else:
                cells.append(r.get("status", "-"))
        for compiler in ("torch", "kiln"):
            r = by.get((name, compiler), {})
            cells.append(f"{r['compile_s']:.1f}" if "compile_s" in r else "-")
        kiln = by.get((name, "kiln"), {})
        cells.append(f"{kiln['peak_mb'] / eager['peak_mb']:.2f}" if "peak_mb" in kiln and "peak_mb" in eager else "-")
        cells.append(kiln.get("status", "-") + (f" ({kiln['reason'][:80]})" if "reason" in kiln else ""))
        lines.append("| " + " | ".join(cells) + " |")
    for compiler, values in ratios.items():
        if values:
            gm = math.exp(sum(map(math.log, values)) / len(values))
            lines.append(f"\n{compiler}: geometric mean {gm:.3f}x over eager on {len(values)} workloads")
    return "\n".join(lines)


def run_pairs(pairs: list[tuple[str, str]], args, save) -> list[dict]:
    """Every pair's record, in the pairs' order, `args.jobs` at a time; `save(records so far)` after each."""
    records: dict[int, dict] = {}

    def finished(index: int, record: dict) -> None:
        records[index] = record
        print(json.dumps(record), flush=True)
        save([records[i] for i in sorted(records)])

    host_wide = "ZOO_TIMING_LOCK" in os.environ  # a shard of a --gpus run: the host's lock, set by its parent
    with tempfile.TemporaryDirectory(prefix="zoo-run-") as run:
        if args.jobs > 1 and not host_wide:
            os.environ["ZOO_TIMING_LOCK"], os.environ["ZOO_RUN_PID"] = f"{run}/timing.lock", str(os.getpid())
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = {pool.submit(spawn_job, *pair, args.timeout, args.profile): i for i, pair in enumerate(pairs)}
            for future in concurrent.futures.as_completed(futures):
                finished(futures[future], future.result())
        if not host_wide:
            os.environ.pop("ZOO_TIMING_LOCK", None)
            os.environ.pop("ZOO_RUN_PID", None)
    for i, record in sorted(records.items()):  # out of GPU memory beside other pairs: again, alone
        if args.jobs > 1 and "out of memory" in record.get("reason", ""):
            finished(i, {**spawn_job(*pairs[i], args.timeout, args.profile), "ran_alone": True})
    return [records[i] for i in sorted(records)]


def run_host(gpus: int, args, out: str) -> list[dict]:
    """Every pair of the run, sharded over this host's first `gpus` GPUs: shard i runs on GPU i, pinned to its own
    slice of the cores, and all shards share one timing lock and stop one another's processes (the run's process
    tree is this process's), so every timed step has the host to itself, as in a run of one shard; the shards'
    compiles overlap. Each shard writes its records and log beside `out` as it goes (`<out>.shard<i>.json`, .log:
    what a run cut short leaves). The shards' records, in the order of the workloads."""
    cores = sorted(os.sched_getaffinity(0))
    per_shard = len(cores) // gpus
    with tempfile.TemporaryDirectory(prefix="zoo-host-") as run:
        env = dict(os.environ, ZOO_TIMING_LOCK=f"{run}/timing.lock", ZOO_RUN_PID=str(os.getpid()))
        shards = []
        for i in range(gpus):
            command = [sys.executable, HERE, "--shard", f"{i}/{gpus}", "--jobs", str(args.jobs), "--timeout",
                       str(args.timeout), "--compilers", args.compilers, "--out", f"{out}.shard{i}.json"]
            command += ["--workloads", args.workloads] * bool(args.workloads) + ["--profile"] * args.profile
            mine = set(cores[i * per_shard:(i + 1) * per_shard])
            shards.append(subprocess.Popen(command, env=dict(env, CUDA_VISIBLE_DEVICES=str(i)),
                                           stdout=open(f"{out}.shard{i}.log", "w"), stderr=subprocess.STDOUT,
                                           preexec_fn=lambda mine=mine: os.sched_setaffinity(0, mine)))
        for shard in shards:
            shard.wait()
        records = []
        for i in range(gpus):
            with contextlib.suppress(OSError, ValueError):
                records += [{**r, "shard": i} for r in json.load(open(f"{out}.shard{i}.json"))["records"]]
            if not any(r.get("shard") == i for r in records):
                print(open(f"{out}.shard{i}.log").read()[-3000:], file=sys.stderr)
    order = {name: k for k, name in enumerate(args.workloads.split(",") if args.workloads else WORKLOADS)}
    return sorted(records, key=lambda r: order.get(r["workload"], len(order)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the workloads and exit")
    parser.add_argument("--workloads", help="comma-separated workload names (default: all)")
    parser.add_argument("--shard", help="i/n: run every n-th workload starting at i")
    parser.add_argument("--compilers", default=",".join(COMPILERS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per (workload, compiler) job")
    parser.add_argument("--out",
                        help="where the run's JSON goes (default benchmarks/results/zoo/<date>_<gpu>_<commit>)")
    parser.add_argument("--profile", action="store_true", help="also profile where each step's GPU time goes")
    parser.add_argument("--jobs", type=int, default=1, help="pairs run at once (timed steps still one at a time)")
    parser.add_argument("--gpus", type=int, default=1,
                        help="shard the run over this many GPUs of the host, timed steps one at a time host-wide")
    parser.add_argument("--table", nargs="+", metavar="RUN", help="print the table of these runs' JSON and exit")
    parser.add_argument("--_job", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._job:
        return job_main(args._job, args.compilers, args.profile)
    if args.table:
        return print(table([r for path in args.table for r in json.load(open(path))["records"]]))
    names = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    if args.shard:
        index, count = map(int, args.shard.split("/"))
        names = names[index::count]
    if args.list:
        return print("\n".join(names))
    gpu = torch.cuda.get_device_name().split()[1].lower() if torch.cuda.is_available() else "cpu"
    out = args.out or result_path("zoo", gpu)
    pairs = [(name, compiler) for name in names for compiler in args.compilers.split(",")]
    header = {"command": " ".join(sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "jobs": args.jobs}
    if args.gpus > 1:
        records = run_host(args.gpus, args, out)
        write_json(out, {**header, "gpus": args.gpus, "records": records})
    else:
        records = run_pairs(pairs, args, lambda done: write_json(out, {**header, "records": done}))
    print(table(records))


if __name__ == "__main__":
    main()

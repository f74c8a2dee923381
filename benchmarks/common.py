"""Helpers the benchmark scripts share: loading the shared model harness, building one compiled step of its
models, timing GPU work with CUDA events, and writing a run's JSON.

The scripts are run as `python benchmarks/<script>.py` from the repository root, so this directory is first on
`sys.path` and they import these helpers as `from common import ...`. Importing this module makes the run strict
(below): every script that runs kiln imports it. The model harness, `models_bench.py`, is not
part of this repository (it lives in the shared bench beside it); scripts that use it take its path as `--bench`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time

import torch

# A benchmark measures kiln's generated code: a fallback (a kernel, graph or frame run through ATen or eagerly,
# kiln/fallbacks.py) must fail the run, not pass as a slower number. KILN_STRICT=0 measures anyway. Set before
# kiln runs anything; subprocesses (cpu_models.py's jobs) inherit it.
os.environ.setdefault("KILN_STRICT", "1")

# Compiler names the scripts accept beside the harness's own: kiln with options, as (harness compiler, options).
KILN_VARIANTS = {"kiln-ro": ("kiln", {"mode": "reduce-overhead"}),
                 "kiln-eager": ("kiln", {"backend": "eager"}),
                 "kiln-aot_eager": ("kiln", {"backend": "aot_eager"}),
                 "kiln-ma": ("kiln", {"mode": "max-autotune-no-cudagraphs"})}


def load_bench(path: str):
    """Import the shared harness from its file path (registered as `models_bench`, which its workers import)."""
    spec = importlib.util.spec_from_file_location("models_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["models_bench"] = module
    spec.loader.exec_module(module)
    return module


ZOO = "zoo:"  # names a workload of kiln's zoo (benchmarks/zoo/workloads.py), as `zoo:llama_train_bf16`


def zoo_module():
    """benchmarks/zoo/workloads.py, imported as the zoo imports it (`workloads`, its folder on sys.path once)."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import workloads

    return workloads


def zoo_workload(name: str, device):
    """The zoo's workload `name` (`zoo:` prefix and all) as the zoo runs it, with the zoo's backend switches (TF32,
    cudnn.benchmark): (its Workload, the model, one fixed batch of inputs); an inference model in its dtype."""
    zoo = zoo_module()
    workload = zoo.WORKLOADS[name.removeprefix(ZOO)]
    zoo.gpu_settings()
    torch.manual_seed(0)
    train = workload.task == "train"
    model, make_inputs = workload.build(workload.batch, device, train)
    zoo.without_dropout(model)
    model.train(train)
    inputs = make_inputs(torch.Generator().manual_seed(1))
    if not train:
        model.to(workload.dtype)
        inputs = tuple(x.to(workload.dtype) if x.is_floating_point() else x for x in inputs)
    return workload, model, inputs


def compiled_by(compiler: str, model, options: dict | None = None):
    """`model` through `compiler`: kiln or torch (torch.compile), with `options` as their keyword arguments (`mode`,
    `backend`; the defaults without), or eager (the model itself)."""
    if compiler == "kiln":
        import kiln
        return kiln.compile(model, **(options or {}))
    if compiler == "torch":
        return torch.compile(model, **(options or {}))
    if options:
        raise ValueError(f"eager takes no options, got {options}")
    return model


def zoo_step(name: str, compiler: str, device=None):
    """One step of the zoo's workload `name` through `compiler` on one fixed batch (see zoo_workload): a function
    of no arguments."""
    workload, model, inputs = zoo_workload(name, device or torch.device("cuda"))
    step = zoo_module().make_step(workload, compiled_by(compiler, model), model)
    return lambda: step(inputs)


def harness_compiler(name: str) -> tuple[str, dict]:
    """The harness compiler and its options behind a name the scripts accept (see KILN_VARIANTS)."""
    return KILN_VARIANTS.get(name, (name, {}))


def build_workload(bench, model_name: str, compiler: str, opts: dict, device: torch.device):
    """One of the harness's models compiled by one of its compilers, with the harness's global settings and seed,
    as (workload, compiled callable, optimizer or None, harness compiler)."""
    bench.apply_global_settings(cudnn_benchmark=True)
    bench.seed_all(0)
    workload = bench.MODELS[model_name].factory(bench.BuildCtx(device, False, 0))
    comp = bench.COMPILERS[compiler]
    fn = comp.wrap(workload.model, opts)
    optimizer = workload.optim_fn(bench.params_for_optimizer(fn, workload.model)) if workload.kind == "train" else None
    return workload, fn, optimizer, comp


def build_step(bench, model_name: str, compiler: str, opts: dict, device: torch.device | None = None):
    """The harness's step function (forward, and for training backward and optimizer) of one compiled model."""
    device = device or torch.device("cuda")
    workload, fn, optimizer, comp = build_workload(bench, model_name, compiler, opts, device)
    return bench.make_step(workload, fn, optimizer, device, comp)


def cuda_time(fn, warmup: int = 5, iters: int = 30) -> float:
    """Median milliseconds of `fn()` over `iters` CUDA-event-timed runs (GPU time, not host time)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def cpu_median_us(fn, inputs, blocks: int = 30, calls: int = 5) -> float:
    """Microseconds per call of `fn(*inputs)` on the CPU: the median over `blocks` blocks of `calls` calls."""
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def print_cpp_rule_table(cases: dict, rule_off, labels: tuple[str, str]) -> None:
    """A Markdown table timing kiln's C++ code for each case (name -> (fn, input shape)) with a code generator rule
    off (`rule_off()`, a context manager) and on, and eager: each checked against eager, the three timed
    interleaved (`cpu_median_us`). The graph cache is off: the two versions of a graph share its key."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln import config
    from kiln.lower.decompositions import decomposition_table
    from kiln.pipeline import compile_aten_graph

    def compiled(fn, inputs):
        with torch.no_grad():
            gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
        return compile_aten_graph(gm, list(inputs), None)

    config.graph_cache = False
    print(f"| case | {labels[0]} | {labels[1]} | eager |  (us per call, {torch.get_num_threads()} threads)\n"
          "|---|---|---|---|")
    for name, (fn, shape) in cases.items():
        inputs = [torch.randn(*shape)]
        with rule_off():
            before = compiled(fn, inputs)
        versions = [before, compiled(fn, inputs), fn]
        for version in versions:
            got = version(*inputs)
            got = got[0] if isinstance(got, (list, tuple)) else got
            torch.testing.assert_close(got, fn(*inputs), rtol=1e-4, atol=1e-4)
        print(f"| {name} | " + " | ".join(f"{cpu_median_us(v, inputs):.0f}" for v in versions) + " |")


def cpu_allocation_profile(fn) -> tuple[int, int]:
    """(bytes allocated at the end of `fn()`, peak allocated during it), relative to its start, from the CPU
    allocator's events as the profiler records them (torch's CPU allocator keeps no peak statistic)."""
    from torch._C._profiler import _EventType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.typed[0] == _EventType.Allocation:
            events.append((e.start_time_ns, e.typed[1].total_allocated, e.typed[1].alloc_size))
        stack.extend(e.children)
    if not events:
        return 0, 0
    events.sort()
    # `total_allocated` counts everything the process holds: subtract what was held at the start.
    base = events[0][1] - events[0][2]
    return events[-1][1] - base, max(t for _, t, _ in events) - base


def compiled(model, compiler: str):
    """`model` under one of the benchmarks' compilers: "eager" (itself), "torch" (torch.compile) or "kiln"."""
    if compiler == "eager":
        return model
    if compiler == "torch":
        return torch.compile(model)
    import kiln
    return kiln.compile(model)


def settled(compiler: str) -> None:
    """Wait for what a compiler finishes in the background after its first call, before steps are timed: kiln
    builds its C++ tensor-guard checks once per machine (about half a minute, in a detached process) and checks
    tensors in Python until then, about 3 us a tensor, a millisecond a step for a model of 300 parameters and
    buffers. A process on a machine that built them loads them at once; timed steps are a long job's."""
    if compiler == "kiln":
        from kiln.capture import tensor_checks
        tensor_checks.wait(timeout=300)


def run_rows(cases, measure) -> list[dict]:
    """Each case's row (`measure(*case)`), printed as it is measured, both compilers' caches emptied after it so
    that every row compiles afresh: the loop of the micro-benchmarks (norm and batch-norm blocks)."""
    import kiln
    rows = []
    for case in cases:
        row = measure(*case)
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch._dynamo.reset()
        kiln.reset()
    return rows


def write_rows(path: str | None, rows: list, device: str) -> None:
    """A micro-benchmark's rows as JSON, with the GPU (or "cpu") and torch version they were measured with."""
    write_json(path, {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                      "torch": torch.__version__, "rows": rows})


def write_json(path: str | None, data) -> None:
    """Write a run's result as indented JSON when the script was given a path (`--out`/`--json`)."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)


def result_path(benchmark: str, machine: str) -> str:
    """Where a run is kept: `benchmarks/results/<benchmark>/<date>_<machine>_<commit>.json`, the commit being the
    checkout measured (`git rev-parse --short HEAD`), so that a file says what produced it."""
    import datetime
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=here, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    folder = os.path.join(here, "results", benchmark)
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{date}_{machine}_{commit}.json")

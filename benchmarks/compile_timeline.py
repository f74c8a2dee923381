"""Where a zoo workload's cold compile spends its wall time, on the GPU: a timeline of kiln's stages, builds and loads.

    PYTHONPATH=. python benchmarks/compile_timeline.py OUTDIR timm_mobilenetv3_train_bf16 tv_resnet_infer_fp32_bs64
    PYTHONPATH=. python benchmarks/compile_timeline.py OUTDIR timm_mobilenetv3_train_bf16@eager   # eager's first step

Each workload (`name@compiler`, compiler kiln by default, or eager or torch) runs in a fresh process with empty
caches, as the zoo runs it (benchmarks/zoo), for one step: the compiler call and the first step's forward, backward
and optimizer step, timed apart. For kiln the run records, with their start and end seconds and thread: each
stage of each ATen graph (`stage`) and each graph whole (`graph`); each Triton compile sent to a build worker
(`worker`) or made in the graph's process (`here`); each kernel's load in the graph's process (`load`: found in
Triton's cache, its C launcher built or found, its binary loaded onto the GPU) and the C launcher builds within
(`launcher`); each build's hand-out to the workers (`build_workers`) and precompile (`precompile_all`); when the
build workers said they were ready (`live`, the number). `TIMELINE_SAMPLE=1` also samples every thread's Python
stack every 5 ms (the seconds in each function, by thread name), which slows the compile a little. One JSON file
per workload goes to OUTDIR (`<name>_<compiler>.json`); one line per workload is printed.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SAMPLE = os.environ.get("TIMELINE_SAMPLE") == "1"
PERIOD_S = 0.005


class Timeline:
    """Events (kind, label, thread, start s, end s) from the run's start, and the stack samples."""

    def __init__(self):
        self.start = time.perf_counter()
        self.events: list[tuple] = []
        self.inclusive = collections.defaultdict(collections.Counter)
        self.stopped = False

    def now(self) -> float:
        return round(time.perf_counter() - self.start, 4)

    def add(self, kind: str, label: str, started: float) -> None:
        self.events.append((kind, label, threading.current_thread().name, started, self.now()))

    def wrap(self, owner, attribute: str, kind: str, label_of=lambda *a, **k: "") -> None:
        """Record each call of `owner.attribute` as an event."""
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            started = self.now()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(kind, label_of(*args, **kwargs), started)
        setattr(owner, attribute, timed)

    def watch(self, pool_of) -> None:
        """Every 5 ms until stopped: the build workers that are ready (`pool_of()`: the pool or None) and, under
        TIMELINE_SAMPLE=1, every other thread's stack."""
        live = 0
        me = threading.get_ident()
        while not self.stopped:
            time.sleep(PERIOD_S)
            pool = pool_of()
            if pool and pool.ready() != live:
                live = pool.live
                self.events.append(("live", str(live), "", self.now(), self.now()))
            if SAMPLE:
                self._sample(me)

    def _sample(self, me: int) -> None:
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            group = names.get(ident, "native").split("_")[0].rstrip("0123456789")
            seen = set()
            while frame is not None:
                seen.add(f"{frame.f_code.co_filename.replace(ROOT + '/', '')}:{frame.f_code.co_name}")
                frame = frame.f_back
            self.inclusive[group].update(seen)
            self.inclusive[group]["<samples>"] += 1


def instrument_kiln(timeline: Timeline) -> None:
    import triton.backends.nvidia.driver as nvidia_driver

    from kiln import pipeline
    from kiln.codegen import triton as triton_target
    from kiln.codegen.triton import build_workers
    try:
        from kiln.codegen.triton import build_worker_process as worker_side
    except ImportError:  # a kiln before the workers' side was a module of its own (comparing with an older one)
        worker_side = build_workers

    stage = pipeline.Stages.__call__

    def timed_stage(self, name, fn, *args):
        started = timeline.now()
        try:
            return stage(self, name, fn, *args)
        finally:
            timeline.add("stage", f"{self.name}:{name}", started)
    pipeline.Stages.__call__ = timed_stage
    timeline.wrap(pipeline, "_cached_or_compiled", "graph", lambda gm, inputs, options, name, *a: name)
    timeline.wrap(build_workers.BuildWorkers, "_ask", "worker", lambda self, w, r: f"{w.pid}:{r['launcher']}")
    timeline.wrap(build_workers.BuildWorkers, "build", "build_workers", lambda self, r, *a: f"{len(r)} requests")
    timeline.wrap(worker_side, "compile_request", "here", lambda r, m: r["launcher"])
    timeline.wrap(triton_target, "_precompile", "load", lambda name, *a: name)
    timeline.wrap(triton_target, "precompile_all", "precompile_all", lambda m, k, *a: f"{len(k)} kernels")
    timeline.wrap(nvidia_driver, "compile_module_from_src", "launcher", lambda *a, **k: k.get("name", ""))


def run_one(name: str, compiler: str, outdir: str) -> None:
    sys.path[:0] = [os.path.join(HERE, "zoo"), HERE]
    import torch

    from workloads import WORKLOADS

    timeline = Timeline()
    pool_of = lambda: None  # noqa: E731
    if compiler == "kiln":
        import kiln
        from kiln.codegen.triton import build_workers
        instrument_kiln(timeline)
        pool_of = lambda: build_workers._pool  # noqa: E731
    workload = WORKLOADS[name]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    train = workload.task == "train"
    model, make_inputs = workload.build(workload.batch, torch.device("cuda"), train)
    model.train(train)
    inputs = make_inputs(torch.Generator().manual_seed(1))
    if not train:
        model.to(workload.dtype)
        inputs = tuple(x.to(workload.dtype) if x.is_floating_point() else x for x in inputs)
    torch.cuda.synchronize()
    watcher = threading.Thread(target=timeline.watch, args=(pool_of,), daemon=True)
    watcher.start()

    def step(label, fn):
        started = timeline.now()
        result = fn()
        torch.cuda.synchronize()
        timeline.add("step", label, started)
        return result

    fn = step("compile call", lambda: {"kiln": lambda: kiln.compile(model), "torch": lambda: torch.compile(model),
                                       "eager": lambda: model}[compiler]())
    if train:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def forward():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return fn(*inputs)
        loss = step("forward", forward)
        step("backward", loss.backward)
        step("optimizer", lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))
    else:
        with torch.no_grad():
            step("forward", lambda: fn(*inputs))
    total = timeline.now()
    timeline.stopped = True
    watcher.join()
    record = {"workload": name, "compiler": compiler, "gpu": torch.cuda.get_device_name(), "total_s": total,
              "events": timeline.events,
              "samples": {group: counts.most_common(150) for group, counts in timeline.inclusive.items()}}
    if compiler == "kiln":
        from kiln.debug import report
        stages = collections.Counter()
        for region in report.collect([kiln.api.context_of(fn)]):
            stages.update(region.stages)
        record["stages"] = {k: round(v, 3) for k, v in stages.items()}
    with open(os.path.join(outdir, f"{name}_{compiler}.json"), "w") as f:
        json.dump(record, f, indent=0)
    print(name, compiler, "total", total, record.get("stages"), flush=True)


def main() -> None:
    if sys.argv[1] == "--one":
        run_one(*sys.argv[2:5])
        return
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for spec in sys.argv[2:]:
        name, _, compiler = spec.partition("@")
        with tempfile.TemporaryDirectory(prefix="timeline-") as caches:
            env = dict(os.environ, KILN_CACHE_DIR=f"{caches}/kiln", TORCHINDUCTOR_CACHE_DIR=f"{caches}/inductor",
                       TRITON_CACHE_DIR=f"{caches}/triton", KILN_STRICT="1")
            subprocess.run([sys.executable, __file__, "--one", name, compiler or "kiln", outdir], env=env)


if __name__ == "__main__":
    main()

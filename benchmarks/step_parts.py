"""Where one step's host time goes, phase by phase, for eager, torch.compile and kiln in one process.

host_profile.py gives a step's total host time and a cProfile, which inflates Python frames more
than C++ ones and so overstates kiln's share. This script uses only perf_counter: after warm-up,
each step runs with the GPU idle (a synchronize before it, not timed) and its phases are timed
without waiting for the GPU:

    train steps: forward (model call and loss), backward, optimizer (zero_grad and step)
    inference:   forward

and, for kiln, the host time inside its parts, per step: the guard functions of the compiled
frames, and each compiled graph's generated wrapper (forward and backward). What is left of a
phase (the output program, the autograd Function, the engine) is the phase minus those.
The back-to-back time (steps queued without a synchronize, as models_bench times them) is
reported too: when it is close to the sum of the phases, the step is host-bound.

    python benchmarks/step_parts.py --bench .bench/models_bench.py \\
        --models cnn_fashion_train,resnet50_infer_bs1 --compilers eager,torch,kiln,kiln-ro --out parts.json
    python benchmarks/step_parts.py --models zoo:phi3_train_bf16 --compilers torch,kiln   # a zoo workload
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from common import ZOO, build_workload, compiled_by, harness_compiler, load_bench, write_json, zoo_workload


class KilnParts:
    """Times kiln's guard functions and compiled graphs from the inside, by wrapping them in place."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock  # perf_counter, or thread_time where other processes share the cores
        self.seconds: dict[str, float] = defaultdict(float)
        self.graphs: list = []  # every graph kiln compiles while listening

    def install(self, compiled_model) -> None:
        from kiln.api import context_of

        for frame in context_of(compiled_model).frames.values():
            for entry in frame.entries:
                entry.guard = self._timed("guard", entry.guard)
        for graph in self.graphs:
            graph.call = self._timed(f"wrapper {graph.artefacts.get('name', '?')}", graph.call)

    def _timed(self, name: str, fn):
        seconds, clock = self.seconds, self.clock

        def timed(*args):
            start = clock()
            try:
                return fn(*args)
            finally:
                seconds[name] += clock() - start
        return timed

    def listen(self) -> None:
        """Collect every graph kiln compiles from now on, until `stop_listening`."""
        from kiln.pipeline import GRAPH_LISTENERS

        GRAPH_LISTENERS.append(self._collect)

    def stop_listening(self) -> None:
        from kiln.pipeline import GRAPH_LISTENERS

        GRAPH_LISTENERS.remove(self._collect)

    def _collect(self, graph, options) -> None:
        self.graphs.append(graph)


def _phases(bench, workload, fn, optimizer, device, comp):
    """The step as named phases (callables run in order), the same work as the bench's step."""
    pre = comp.pre_step
    if workload.kind == "train":
        state = {}

        def forward():
            if pre is not None:
                pre()
            with bench.autocast_ctx(device, workload.amp_dtype):
                out = fn(*workload.args, **workload.kwargs)
                state["loss"] = workload.loss_fn(out, workload.target)

        def backward():
            state.pop("loss").backward()

        def optimize():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return {"forward": forward, "backward": backward, "optimizer": optimize}
    grad_ctx = torch.inference_mode if comp.infer_ctx == "inference_mode" else torch.no_grad

    def infer():
        if pre is not None:
            pre()
        with grad_ctx(), bench.autocast_ctx(device, workload.amp_dtype):
            fn(*workload.args, **workload.kwargs)

    return {"forward": infer}


def _zoo_phases(name: str, compiler: str, options: dict, device: torch.device):
    """A zoo workload's step (benchmarks/zoo/workloads.py `make_step`: bf16 autocast and AdamW for training) as
    named phases, and the compiled callable."""
    workload, model, inputs = zoo_workload(name, device)
    fn = compiled_by(compiler, model, options)
    if workload.task != "train":
        def infer():
            with torch.no_grad():
                fn(*inputs)
        return {"forward": infer}, fn
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = {}

    def forward():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            state["loss"] = fn(*inputs)

    def backward():
        state.pop("loss").backward()

    def optimize():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return {"forward": forward, "backward": backward, "optimizer": optimize}, fn


def measure(bench, model_name: str, compiler: str, steps: int, device: torch.device) -> dict:
    base, opts = harness_compiler(compiler)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    parts = KilnParts() if base == "kiln" else None
    if parts is not None:
        parts.listen()
    if model_name.startswith(ZOO):
        phases, fn = _zoo_phases(model_name, base, opts, device)
    else:
        workload, fn, optimizer, comp = build_workload(bench, model_name, base, opts, device)
        phases = _phases(bench, workload, fn, optimizer, device, comp)
    for _ in range(15):
        for run in phases.values():
            run()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        for run in phases.values():
            run()
    sync()
    back_to_back = (time.perf_counter() - t0) * 1e3 / steps

    if parts is not None:
        parts.install(fn)
    samples = defaultdict(list)
    for _ in range(steps):
        sync()
        for name, run in phases.items():
            t = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - t) * 1e6)
    sync()
    row = {"model": model_name, "compiler": compiler, "back_to_back_ms": round(back_to_back, 3),
           "phases_us": {k: round(statistics.median(v), 1) for k, v in samples.items()}}
    row["host_sum_ms"] = round(sum(row["phases_us"].values()) / 1e3, 3)
    if parts is not None:
        row["kiln_parts_us"] = {k: round(v / steps * 1e6, 1) for k, v in sorted(parts.seconds.items())}
        parts.stop_listening()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", help="path to models_bench.py (not for the zoo's workloads, `zoo:<name>`)")
    p.add_argument("--models", default="cnn_fashion_train")
    p.add_argument("--compilers", default="eager,torch,kiln")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", default="cuda", help="cuda, or cpu to try the script without a GPU")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    bench = load_bench(args.bench) if args.bench else None
    rows = []
    for model in args.models.split(","):
        for compiler in args.compilers.split(","):
            row = measure(bench, model, compiler, args.steps, torch.device(args.device))
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch._dynamo.reset()
            import kiln
            kiln.reset()
    write_json(args.out, rows)


if __name__ == "__main__":
    main()

"""Cold compile of a model for an H100/H200 on a machine without a GPU: kiln's phases and its Triton builds.

    PYTHONPATH=.:tests python benchmarks/fake_gpu_compile.py --model tv_densenet121 --train [--bs 64] [--img 224]
        [--dtype bf16|fp32] [--jobs N] [--interpret] [--out FILE --label TEXT]

The model (`tv_<name>`: torchvision; `zoo:<name>`: a model of benchmarks/zoo/workloads.py as the zoo builds it,
a Hugging Face model returning its own loss when training; `ct:<name>`: one of benchmarks/compile_time.py's
plain-PyTorch models; else timm) is compiled by kiln on fake CUDA tensors
(tests/support/fake_cuda.py: the forward traced on fake CUDA tensors, kiln's AOT stage, each ATen graph through
kiln's code generator for CUDA). Unlike the sm_90 tests, Triton is not interpreted: every kernel goes through
Triton's full compile for sm_90 (TTIR to cubin, with ptxas) behind a driver that only names the target, as on the
GPU, and nothing is launched. With `--train` one bf16-autocast (or fp32) training step (forward and backward of
the output's sum), else inference with the weights in `--dtype`.

It reports per graph the seconds of each stage (`build` is the Triton compile), the CPU seconds of the compiling
thread in each stage summed over the graphs (`stage_cpu_s`; `autograd and rest` is the compile's CPU outside
kiln's stages and the harness's own re-traces), and for the whole compile: wall seconds, the CPU seconds of this
process and of its children (the build workers and ptxas), how many kernels the graphs have, how many Triton
compiles ran in this process and how many in build workers (a build hands kernels to the workers and to
this process side by side). On a loaded host compare CPU seconds and compile
counts, not wall seconds. KILN_CACHE_DIR and Triton's cache are fresh
temporary folders (a cold compile); `--jobs` sets KILN_BUILD_JOBS. `--interpret` leaves Triton interpreting
(no kernel is compiled): kiln's own stages alone, quickly.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tv_densenet121")
    p.add_argument("--train", action="store_true")
    p.add_argument("--bs", type=int, default=64)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--jobs", type=int, default=None, help="KILN_BUILD_JOBS (default: the CPUs of this process)")
    p.add_argument("--out", default=None, help="append the result to this JSON file")
    p.add_argument("--label", default="")
    p.add_argument("--interpret", action="store_true", help="Triton interpreted: no kernel compiled")
    return p.parse_args()


def fresh_caches(jobs: int | None, interpret: bool) -> None:
    """Cold caches, Triton compiling for real (or interpreting), and the build jobs, before kiln or Triton is
    imported."""
    os.environ.pop("TRITON_INTERPRET", None)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-cache-")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cache-")
    os.environ.setdefault("KILN_STRICT", "1")
    if jobs is not None:
        os.environ["KILN_BUILD_JOBS"] = str(jobs)


def compile_only_triton() -> dict:
    """Triton compiles for sm_90 without a GPU; kiln's launchers keep no binary (nothing is launched). Returns the
    counters of Triton compiles in this process."""
    import triton
    import triton.compiler.compiler as triton_compiler
    from triton.backends.compiler import GPUTarget

    from kiln.codegen.triton.build_worker_process import TargetOnlyDriver
    from kiln.codegen.triton.launch import Launcher

    triton.runtime.driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    Launcher._add = lambda self, key, binary, ints: None
    counts = {"in_process": 0}
    make_ir = triton_compiler.ASTSource.make_ir

    def counted(self, *args):
        counts["in_process"] += 1
        return make_ir(self, *args)

    triton_compiler.ASTSource.make_ir = counted
    return counts


def stage_cpu_seconds() -> tuple[dict, list]:
    """(stage -> CPU seconds of the compiling thread, summed over graphs; [seconds in the harness's re-traces]),
    filled as kiln compiles."""
    from kiln import pipeline
    from support import fake_cuda

    seconds, harness = {}, [0.0]
    run_stage = pipeline.Stages.__call__

    def timed(self, stage, *args, **kwargs):
        start = time.thread_time()
        try:
            return run_stage(self, stage, *args, **kwargs)
        finally:
            seconds[stage] = seconds.get(stage, 0.0) + time.thread_time() - start

    def harness_timed(fn):
        def run(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                harness[0] += time.thread_time() - start
        return run

    pipeline.Stages.__call__ = timed
    fake_cuda.on_device = harness_timed(fake_cuda.on_device)
    fake_cuda.forward_graph = harness_timed(fake_cuda.forward_graph)
    return seconds, harness


def model_and_inputs(args):
    """(module, its input, autocast dtype or None) for `--model`: `zoo:<name>` is a model of the zoo
    (benchmarks/zoo/workloads.py, built as the zoo builds it: `--bs` and the zoo's sequence length, `--img`
    unused), `ct:<name>` one of benchmarks/compile_time.py's plain-PyTorch models at `--img`, `tv_<name>`
    torchvision's, else timm's."""
    import torch

    if args.model.startswith(("zoo:", "ct:")):
        return _benchmark_model(args)
    if args.model.startswith("tv_"):
        import torchvision

        model = getattr(torchvision.models, args.model[3:])()
    else:
        import timm

        model = timm.create_model(args.model)
    x = torch.randn(args.bs, 3, args.img, args.img)
    if args.train:
        return _Summed(model).train(), [x], torch.bfloat16 if args.dtype == "bf16" else None
    model = model.eval()
    if args.dtype == "bf16":
        return model.to(torch.bfloat16), [x.to(torch.bfloat16)], None
    return model, [x], None


def _benchmark_model(args):
    """A model of the zoo or of compile_time.py, as `model_and_inputs` returns it. Training sums the output of
    compile_time.py's vision models as the other vision models here; a zoo model returns its own loss."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    kind, _, name = args.model.partition(":")
    amp = torch.bfloat16 if args.train and args.dtype == "bf16" else None
    if kind == "zoo":
        from zoo.workloads import MODELS

        model, make = MODELS[name][1](args.bs, torch.device("cpu"), args.train)
        inputs = list(make(torch.Generator().manual_seed(0)))
    else:
        from compile_time import build_model

        model, inputs = build_model(name)
        inputs = [torch.randn(args.bs, *t.shape[1:]) if t.is_floating_point() else t for t in inputs]
        if inputs[0].dim() == 4:
            inputs[0] = torch.randn(args.bs, 3, args.img, args.img)
        if args.train:
            model = _Summed(model)
    if args.train:
        return model.train(), inputs, amp
    model = model.eval()
    if args.dtype == "bf16":
        return model.to(torch.bfloat16), [t.to(torch.bfloat16) if t.is_floating_point() else t
                                          for t in inputs], None
    return model, inputs, None


def _summed_forward(self, *inputs):
    return self.model(*inputs).float().sum()


def _Summed(model):
    import torch

    wrapper = type("Summed", (torch.nn.Module,), {"forward": _summed_forward})()
    wrapper.model = model
    return wrapper


def worker_cpu_seconds() -> tuple[float, int]:
    """(CPU seconds of the live build workers and their finished children, requests they were sent)."""
    try:
        from kiln.codegen.triton import build_workers
    except ImportError:  # a kiln without build workers
        return 0.0, 0
    pool = getattr(build_workers, "_pool", None)
    if not pool:
        return 0.0, 0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    pids = getattr(pool, "pids", None) or [worker.pid for worker in pool.workers]  # one process each, or forked
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / tick, getattr(pool, "requests_sent", 0)


def main() -> None:
    args = parse()
    fresh_caches(args.jobs, args.interpret)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import resource

    counts = {"in_process": 0} if args.interpret else compile_only_triton()
    stage_cpu, harness_cpu = stage_cpu_seconds()
    try:
        from kiln.codegen.triton import build_workers

        build = build_workers.BuildWorkers.build

        def counted_build(self, requests, compile_here=None):
            here = [0]

            def counted_here(request):
                here[0] += 1
                return compile_here(request)

            done = build(self, requests, *([counted_here] if compile_here else []))
            self.requests_sent = getattr(self, "requests_sent", 0) + len(done) - here[0]  # built by a worker
            return done

        build_workers.BuildWorkers.build = counted_build
    except ImportError:  # a kiln without build workers
        pass
    from support.fake_cuda import compile_model

    model, inputs, amp = model_and_inputs(args)
    start, cpu, thread_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    from kiln.codegen import triton as triton_target

    if hasattr(triton_target, "start_build_workers"):  # as kiln's backend does when a CUDA graph enters it
        triton_target.start_build_workers("cuda:0")
    graphs = compile_model(model, inputs, train=args.train, amp=amp, name="g")
    wall, cpu, thread_cpu = time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - thread_cpu
    stage_cpu["autograd and rest"] = thread_cpu - harness_cpu[0] - sum(stage_cpu.values())
    workers_cpu, sent = worker_cpu_seconds()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = {"label": args.label, "model": args.model, "train": args.train, "dtype": args.dtype, "bs": args.bs,
              "img": args.img, "jobs": os.environ.get("KILN_BUILD_JOBS"), "wall_s": round(wall, 2),
              "cpu_s": round(cpu, 2),
              "children_cpu_s": round(children.ru_utime + children.ru_stime + workers_cpu, 2),
              "stage_cpu_s": {k: round(v, 2) for k, v in stage_cpu.items()}, "interpret": args.interpret,
              "kernels": sum(g.num_kernels for g in graphs), "triton_compiles_in_process": counts["in_process"],
              "triton_compiles_in_workers": sent,
              "graphs": [{"name": g.artefacts["name"], "kernels": g.num_kernels,
                          "times": {k: round(v, 3) for k, v in g.artefacts["times"].items()}} for g in graphs]}
    print(json.dumps(result, indent=1))
    if args.out:
        path = Path(args.out)
        runs = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(runs + [result], indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Cold compile time of kiln by stage, on big training graphs (issue #5).

    python benchmarks/compile_time.py [--models densenet121,transformer12,resnet18] [--targets cpp,triton]
                                      [--autocast bf16|none] [--run] [--profile FILE] [--label TEXT]
                                      [--triton-build [--triton-pool serial:1|thread:N|process:N]]

Each (model, target) job runs in a fresh subprocess with an empty KILN_CACHE_DIR (a cold compile).
A job compiles one training step (forward + backward, under bf16 autocast by default) of the model
with `kiln.compile(model)`'s default backend and reports seconds per stage:

    capture     bytecode -> FX graph + guards + output program (the wall time of the first call
                minus the time in the backend)
    aot         kiln.autograd: analyze, trace joint, functionalize, partition (AOTCompiled.traces)
    decompose   re-tracing the ATen graphs through kiln's decompositions, when needed
    lower       ATen graph -> loop-level IR (+ verify)
    schedule    fusion, kernel names
    plan memory buffer lifetimes and reuse
    generate    kernel source + wrapper source
    build       the C++ compiler (cpp), or writing and importing the kernel module (triton); the wrapper loaded
    triton_build  (--triton-build, triton only) every generated Triton kernel compiled to a CUBIN for
                sm_90 through Triton's own compiler, without a GPU: what `build` costs on the GPU
                (kiln's Triton target compiles its kernels one after another; --triton-pool tries
                threads or forked processes instead)

`other` is the backend's time outside its stages (the decomposition table built on the first compile,
checks between passes). `cpu_s` is the job process's CPU time over the compile (capture and backend): the C++
compiler runs in child processes and is not in it, and unlike the seconds per stage it barely moves with the
load of a shared host. `stages_cpu_s` splits the compiling thread's CPU seconds the same way (capture, the
autograd passes together, each stage, other); the line printed per job shows those.

Targets: `cpp` is kiln's CPU target; `triton` is the GPU code generator run on CPU tensors
(KILN_CPU_BACKEND=triton TRITON_INTERPRET=1). By default a job stops right after the compile (the
backend raises once kiln.inductor has returned), so no kernel runs; `--run` also runs the step and
checks nothing else. Models are built here in plain PyTorch: DenseNet-121 (torchvision's
architecture: growth 32, blocks (6, 12, 24, 16), bn_size 4, BN+ReLU+Conv layers that concatenate
every earlier feature map), a 12-layer pre-LN transformer, a ResNet-18-style CNN and a ConvNeXt-T-style
CNN (depths 3, 3, 9, 3), at small sizes (compile time depends on the graph, not on the tensor sizes);
`bert12` and `gpt2_12` are transformers' BERT (masked LM) and GPT-2 (causal LM) at 12 layers, width 256,
`t5_6` its T5 (6 encoder and 6 decoder layers, width 256) and `vit12` its ViT (12 layers, width 256, 64x64
images in 8x8 patches, 10 classes).
The minifier's repro on a failed compile is off (KILN_REPRO_LEVEL=0): the job's stop after the compile is
not a failure to reproduce.

Results: benchmarks/results/compile_time/<date>_cpu_<commit>.json (one entry per job, with the host); with
--label, runs written to the same file are kept side by side (before/after).
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
import time
from pathlib import Path

from common import result_path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["densenet121", "transformer12", "resnet18"]
TARGETS = ["cpp", "triton"]


# ----------------------------------------------------------------------------- models


def build_model(name: str):
    import inspect

    import torch
    import torch.nn.functional as F
    from torch import nn

    class DenseLayer(nn.Module):
        def __init__(self, cin, growth, bn_size):
            super().__init__()
            self.norm1 = nn.BatchNorm2d(cin)
            self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
            self.norm2 = nn.BatchNorm2d(bn_size * growth)
            self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

        def forward(self, features):  # a list of every earlier feature map, as torchvision's _DenseLayer
            x = torch.cat(features, 1)
            x = self.conv1(F.relu(self.norm1(x)))
            return self.conv2(F.relu(self.norm2(x)))

    class DenseBlock(nn.ModuleDict):
        def __init__(self, layers, cin, growth, bn_size):
            super().__init__()
            for k in range(layers):
                self[f"denselayer{k + 1}"] = DenseLayer(cin + k * growth, growth, bn_size)

        def forward(self, x):
            features = [x]
            for layer in self.values():
                features.append(layer(features))
            return torch.cat(features, 1)

    class Transition(nn.Sequential):
        def __init__(self, cin, cout):
            super().__init__(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2, 2))

    class DenseNet(nn.Module):
        def __init__(self, growth=32, blocks=(6, 12, 24, 16), init=64, bn_size=4, classes=1000):
            super().__init__()
            layers = [nn.Conv2d(3, init, 7, 2, 3, bias=False), nn.BatchNorm2d(init), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
            c = init
            for k, n in enumerate(blocks):
                layers.append(DenseBlock(n, c, growth, bn_size))
                c += n * growth
                if k != len(blocks) - 1:
                    layers.append(Transition(c, c // 2))
                    c //= 2
            layers.append(nn.BatchNorm2d(c))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(c, classes)

        def forward(self, x):
            x = F.relu(self.features(x))
            return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Transformer(nn.Module):
        def __init__(self, vocab=1000, d=256, heads=4, layers=12, seq=64):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
            self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.tok(idx) + self.pos[: idx.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        def __init__(self, widths=(64, 128, 256, 512), depth=(2, 2, 2, 2), classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, c = [], 64
            for k, (w, n) in enumerate(zip(widths, depth)):
                for j in range(n):
                    blocks.append(Basic(c, w, 2 if j == 0 and k > 0 else 1))
                    c = w
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(c, classes)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class LMLoss(nn.Module):  # a Hugging Face LM called positionally, returning its language-modelling loss
        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, ids):
            return self.hf(input_ids=ids, labels=ids).loss

    class ImageLoss(nn.Module):  # a Hugging Face image classifier called positionally, returning its loss
        def __init__(self, hf):
            super().__init__()
            self.hf = hf

        def forward(self, pixels, labels):
            return self.hf(pixel_values=pixels, labels=labels).loss

    class ConvNeXtBlock(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

        def forward(self, x):
            y = self.norm(self.dw(x).permute(0, 2, 3, 1))
            y = self.gamma * self.fc2(F.gelu(self.fc1(y)))
            return x + y.permute(0, 3, 1, 2)

    class ConvNeXt(nn.Module):  # ConvNeXt-T's layout (depths 3, 3, 9, 3) at small widths
        def __init__(self, dims=(32, 64, 128, 256), depths=(3, 3, 9, 3), classes=1000):
            super().__init__()
            self.stem = nn.Conv2d(3, dims[0], 4, stride=4)
            self.stem_norm = nn.LayerNorm(dims[0])
            self.stages, self.downs = nn.ModuleList(), nn.ModuleList()
            for k, (d, n) in enumerate(zip(dims, depths)):
                if k:
                    self.downs.append(nn.ModuleList([nn.LayerNorm(dims[k - 1]), nn.Conv2d(dims[k - 1], d, 2, 2)]))
                self.stages.append(nn.Sequential(*[ConvNeXtBlock(d) for _ in range(n)]))
            self.norm, self.head = nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], classes)

        def forward(self, x):
            x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            for k, stage in enumerate(self.stages):
                if k:
                    norm, conv = self.downs[k - 1]
                    x = conv(norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
                x = stage(x)
            return self.head(self.norm(x.mean((2, 3))))

    torch.manual_seed(0)
    if name in HF_MODELS:
        import transformers

        config_class, model_class, config = HF_MODELS[name]
        hf = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
        if "pixel_values" in inspect.signature(hf.forward).parameters:
            return ImageLoss(hf), (torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,)))
        return LMLoss(hf), (torch.randint(0, 1000, (2, 64)),)
    if name == "convnext":
        return ConvNeXt(), (torch.randn(2, 3, 64, 64),)
    if name == "densenet121":
        return DenseNet(), (torch.randn(2, 3, 64, 64),)
    if name == "transformer12":
        return Transformer(), (torch.randint(0, 1000, (2, 64)),)
    if name == "resnet18":
        return ResNet(), (torch.randn(2, 3, 64, 64),)
    raise ValueError(f"unknown model {name}")


# ----------------------------------------------------------------------------- one job (a subprocess)


HF_MODELS = {  # Hugging Face models at 12 layers (transformers' own modules), with random weights
    "bert12": ("BertConfig", "BertForMaskedLM", dict(num_hidden_layers=12, hidden_size=256, num_attention_heads=4,
                                                     intermediate_size=1024, vocab_size=1000)),
    "gpt2_12": ("GPT2Config", "GPT2LMHeadModel", dict(n_layer=12, n_embd=256, n_head=4, vocab_size=1000,
                                                      n_positions=64, use_cache=False)),
    "t5_6": ("T5Config", "T5ForConditionalGeneration", dict(num_layers=6, d_model=256, d_kv=64, d_ff=1024,
                                                            num_heads=4, vocab_size=1000, use_cache=False)),
    "vit12": ("ViTConfig", "ViTForImageClassification", dict(num_hidden_layers=12, hidden_size=256,
                                                             num_attention_heads=4, intermediate_size=1024,
                                                             image_size=64, patch_size=8, num_labels=10)),
}


class _StopAfterCompile(Exception):
    pass


def job(model_name: str, target: str, autocast: str, run: bool, triton_build: bool, profile: str | None) -> dict:
    import torch

    import kiln
    from kiln.pipeline import STAGES

    model, inputs = build_model(model_name)
    compiled: list = []
    backend_seconds, backend_cpu = [0.0], [0.0]
    step_cpu = _cpu_timers()

    def backend(gm, example_inputs):
        start, cpu_start = time.perf_counter(), time.thread_time()
        out = kiln.inductor(gm, example_inputs)
        backend_seconds[0] += time.perf_counter() - start
        backend_cpu[0] += time.thread_time() - cpu_start
        compiled.append(out)
        if not run:
            raise _StopAfterCompile
        return out

    cmodel = kiln.compile(model, backend=backend)

    def step():
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if autocast == "bf16"
               else torch.autocast("cpu", enabled=False))
        with ctx:
            out = cmodel(*inputs)
        out.float().sum().backward()

    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    start, cpu_start, thread_start = time.perf_counter(), time.process_time(), time.thread_time()
    try:
        step()
    except Exception as e:  # the stop after compile arrives wrapped by kiln's capture
        if not any(isinstance(x, _StopAfterCompile) for x in _chain(e)):
            raise
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    thread_cpu = time.thread_time() - thread_start
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    stages = {"capture": 0.0, "aot": 0.0, **dict.fromkeys(STAGES, 0.0)}
    aot_passes: dict = {}
    graphs = []
    for c in compiled:
        for passes in c.traces.values():
            for t in passes:
                if not t.name.startswith("compile"):
                    stages["aot"] += t.seconds
                    aot_passes[t.name] = aot_passes.get(t.name, 0.0) + t.seconds
        for g in c.compiled_graphs:
            a = g.artefacts
            for k, v in a.get("times", {}).items():
                stages[k] = stages.get(k, 0.0) + v
            graphs.append({"name": a.get("name"), "kernels": a.get("num_kernels", 0), "fallback": a.get("fallback"),
                           "times": {k: round(v, 3) for k, v in a.get("times", {}).items()}})
    if run:
        records = list(cmodel._kiln_context.records)
        stages["capture"] = sum(r.compile_seconds - r.backend_seconds for r in records)
    else:
        stages["capture"] = wall - backend_seconds[0]
    # the backend's time outside its stages: building the decomposition table, checks between passes
    stages["other"] = backend_seconds[0] - sum(v for k, v in stages.items() if k != "capture")
    result = {"model": model_name, "target": target, "autocast": autocast, "ran_step": run,
              "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "backend_s": round(backend_seconds[0], 3),
              "stages_s": {k: round(v, 3) for k, v in stages.items()},
              "stages_cpu_s": _stages_cpu(step_cpu, thread_cpu, backend_cpu[0]),
              "aot_passes_cpu_s": {k: round(v, 3) for k, v in step_cpu.items()
                                   if k not in STAGES and not k.startswith("compile")},
              "aot_passes_s": {k: round(v, 3) for k, v in aot_passes.items()}, "graphs": graphs,
              "kernels": sum(g["kernels"] for g in graphs)}
    if triton_build and target == "triton":
        result["triton_build"] = _triton_build_all(compiled)
        result["stages_s"]["triton_build"] = result["triton_build"]["seconds"]
    return result


def _cpu_timers() -> dict:
    """Record, as kiln compiles, the compiling thread's CPU seconds in each pipeline stage and each autograd pass
    (name -> seconds, each exclusive of the stages and passes it runs: a `compile ...` pass holds a graph's stages).
    Unlike wall seconds these hardly move with the load of a shared host."""
    from kiln import pipeline
    from kiln.autograd import aot

    seconds: dict = {}
    nested: list[float] = []

    def timed(name: str, run):
        start = time.thread_time()
        nested.append(0.0)
        try:
            return run()
        finally:
            spent = time.thread_time() - start
            inner = nested.pop()
            if nested:
                nested[-1] += spent
            seconds[name] = seconds.get(name, 0.0) + spent - inner

    run_stage, run_pass = pipeline.Stages.__call__, aot.AOTCompiled._pass
    pipeline.Stages.__call__ = lambda self, stage, fn, *args: timed(stage, lambda: run_stage(self, stage, fn, *args))
    aot.AOTCompiled._pass = lambda self, key, name, fn, *args, **kwargs: timed(
        name, lambda: run_pass(self, key, name, fn, *args, **kwargs))
    return seconds


def _stages_cpu(recorded: dict, thread_cpu: float, backend_cpu: float) -> dict:
    """CPU seconds of the compiling thread: capture (outside the backend), the autograd passes together (`aot`),
    each pipeline stage, and the backend's rest (`other`: the `compile ...` passes outside their stages, the
    decomposition table, the checks between passes)."""
    from kiln.pipeline import STAGES

    stages = {"capture": thread_cpu - backend_cpu,
              "aot": sum(v for k, v in recorded.items() if k not in STAGES and not k.startswith("compile")),
              **{k: recorded.get(k, 0.0) for k in STAGES}}
    stages["other"] = backend_cpu - sum(v for k, v in stages.items() if k != "capture")
    return {k: round(v, 3) for k, v in stages.items()}


def _chain(e):
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def _triton_build_all(compiled) -> dict:
    """Compile each generated Triton kernel for sm_90 in a child process without TRITON_INTERPRET (no GPU needed)."""
    from kiln.codegen import triton as triton_target

    sigs = []
    for c in compiled:
        for g in c.compiled_graphs:
            src, sched = g.artefacts.get("kernels.py"), g.artefacts.get("schedule")
            if not isinstance(src, str) or sched is None:
                continue
            # again, for each kernel's argument types (this script compiles in the default mode: no autotuning)
            _, kernels = triton_target.generate_module(sched, max_autotune=False)
            sigs.append({"path": str(_module_path(triton_target, src)), "kernels": {
                f"_launch_{k.jit_name}": ([str(d) for d in k.example_args()[0]], list(k.example_args()[1]))
                for k in kernels.values()}})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(sigs, f)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        proc = subprocess.run([sys.executable, __file__, "--_triton_build", f.name], env=env, capture_output=True,
                              text=True, cwd=str(ROOT))
    finally:
        os.unlink(f.name)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"seconds": 0.0, "error": (proc.stderr or proc.stdout)[-2000:]}


def _module_path(triton_target, source: str) -> Path:
    from kiln.runtime import cache

    key = triton_target.source_key(source)
    return cache.folder("triton", key[:2]) / f"{key}.py"


_TRITON_TYPES = {"torch.float32": "*fp32", "torch.float16": "*fp16", "torch.bfloat16": "*bf16",
                 "torch.float64": "*fp64", "torch.int64": "*i64", "torch.int32": "*i32", "torch.int16": "*i16",
                 "torch.int8": "*i8", "torch.uint8": "*u8", "torch.bool": "*i1"}


def triton_build_worker(spec_file: str) -> dict:
    """Cross-compile every kernel of the given kernel modules to sm_90 (one after another, as kiln's build does)."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    total, count, per = 0.0, 0, []
    jobs_list = []
    for entry in json.loads(Path(spec_file).read_text()):
        spec = importlib.util.spec_from_file_location(f"bench_{Path(entry['path']).stem[:16]}", entry["path"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        for name, (dtypes, ints) in entry["kernels"].items():
            launcher = getattr(module, name)
            fn = launcher.fn
            names = fn.arg_names
            signature, constexprs = {}, {}
            tensors = [_TRITON_TYPES[d] for d in dtypes]
            for k, a in enumerate(names):
                if a in launcher.constexprs:
                    signature[a] = "constexpr"
                    constexprs[(k,)] = launcher.constexprs[a]
                elif k < len(tensors):
                    signature[a] = tensors[k]
                else:
                    signature[a] = "i64" if abs(ints[k - len(tensors)]) >= 2 ** 31 else "i32"
            jobs_list.append((fn, signature, constexprs, launcher.num_warps))

    def one(job):
        fn, signature, constexprs, num_warps = job
        start = time.perf_counter()
        triton.compile(ASTSource(fn, signature, constexprs), target=target, options={"num_warps": num_warps})
        return time.perf_counter() - start

    kind, _, n = os.environ.get("KILN_BENCH_TRITON_POOL", "serial:1").partition(":")
    workers = int(n or 1)
    start = time.perf_counter()
    if kind == "thread" and workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            per = list(pool.map(one, jobs_list))
    elif kind == "process" and workers > 1:  # forked workers inherit the kernels (as Inductor's compile pool)
        import multiprocessing

        global _JOBS
        _JOBS = (one, jobs_list)
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            per = pool.map(_one_forked, range(len(jobs_list)))
    else:
        per = [one(j) for j in jobs_list]
    total, count = time.perf_counter() - start, len(per)
    per.sort()
    return {"seconds": round(total, 3), "kernels": count, "pool": f"{kind}:{workers}",
            "median_kernel_s": round(per[len(per) // 2], 4) if per else 0.0,
            "max_kernel_s": round(per[-1], 4) if per else 0.0}


_JOBS = None


def _one_forked(k: int) -> float:
    one, jobs = _JOBS
    return one(jobs[k])


# ----------------------------------------------------------------------------- the driver


def run_job(args, model: str, target: str, cache: str) -> dict:
    env = dict(os.environ, KILN_CACHE_DIR=cache, PYTHONPATH=str(ROOT), KILN_BENCH_TRITON_POOL=args.triton_pool,
               KILN_REPRO_LEVEL="0")
    if target == "triton":
        env.update(KILN_CPU_BACKEND="triton", TRITON_INTERPRET="1", TRITON_CACHE_DIR=os.path.join(cache, "tcache"))
    else:
        env.pop("KILN_CPU_BACKEND", None)
    cmd = [sys.executable, __file__, "--_job", json.dumps({
        "model": model, "target": target, "autocast": args.autocast, "run": args.run,
        "triton_build": args.triton_build, "profile": args.profile and f"{args.profile}.{model}.{target}.prof"})]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=str(ROOT))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            res["process_s"] = round(time.perf_counter() - start, 3)
            return res
    return {"model": model, "target": target, "status": "error", "error": (proc.stderr or proc.stdout)[-3000:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--autocast", default="bf16", choices=["bf16", "none"])
    p.add_argument("--run", action="store_true", help="also run the compiled step (default: stop after compile)")
    p.add_argument("--triton-build", action="store_true", help="cross-compile the Triton kernels for sm_90")
    p.add_argument("--triton-pool", default="serial:1",
                   help="with --triton-build: serial:1, thread:N or process:N (forked) workers compiling the kernels")
    p.add_argument("--profile", default=None, help="write a cProfile of each job to PROFILE.<model>.<target>.prof")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--label", default="", help="a note kept with the results (e.g. 'before')")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    results = []
    for model in args.models.split(","):
        for target in args.targets.split(","):
            with tempfile.TemporaryDirectory(prefix="kiln_ct_") as cache:
                res = run_job(args, model, target, cache)
            results.append(res)
            stages = res.get("stages_cpu_s")
            print(f"{model:14s} {target:6s} CPU s: " + (" ".join(f"{k} {v:.2f}" for k, v in stages.items()) +
                  f" | backend {res['backend_s']:.2f} s, {res['kernels']} kernels, compile CPU {res['cpu_s']:.2f} s"
                  if stages else res.get("error", "")),
                  flush=True)
    out = Path(args.out or result_path("compile_time", "cpu"))
    doc = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "label": args.label,
           "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
           "argv": sys.argv[1:], "results": results}
    if out.exists() and args.label:  # keep earlier labelled runs (before/after) side by side
        try:
            old = json.loads(out.read_text())
            runs = old.get("runs", [old])
            doc = {"runs": runs + [doc]}
        except (ValueError, OSError):
            pass
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--_job":
        spec = json.loads(sys.argv[2])
        print("RESULT " + json.dumps(job(spec["model"], spec["target"], spec["autocast"], spec["run"],
                                         spec["triton_build"], spec["profile"])))
    elif len(sys.argv) > 2 and sys.argv[1] == "--_triton_build":
        print("RESULT " + json.dumps(triton_build_worker(sys.argv[2])))
    else:
        sys.exit(main())

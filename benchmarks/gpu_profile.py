"""Where a compiled step's GPU time goes: kernel time by kind, and the launch gaps between.

For one model of the shared benchmark (`models_bench.py`, passed by path because it
lives outside this repository) and each compiler, runs warm-up steps and then profiles
a few steps with torch.profiler, and splits each step's wall time into

    matmul     cuBLAS / CUTLASS GEMMs (extern matmuls and linear layers)
    attention  fused attention kernels (flash, memory-efficient, cuDNN)
    triton     generated Triton kernels (kiln's or torch.compile's)
    other      every other CUDA kernel (ATen elementwise, reductions, copies, optimizer)
    gaps       step wall time minus the sum of kernel times: launch overhead, host code,
               synchronisation (kernels run one at a time on one stream here)

    python benchmarks/gpu_profile.py --bench .bench/models_bench.py \\
        --models bert_infer_bf16,gpt2_train --compilers eager,torch,kiln --out profile.json
"""
from __future__ import annotations

import argparse
import re
import time

import torch

from common import build_step, harness_compiler, load_bench, write_json

KINDS = ("matmul", "attention", "triton", "other")


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    if any(k in lowered for k in ("gemm", "cutlass", "sm90_xmma", "cublas", "nvjet", "splitk")):
        return "matmul"
    if any(k in lowered for k in ("flash", "fmha", "attention", "cudnn_generated")):
        return "attention"
    if lowered.startswith(("triton", "kiln", "fused_")) or "triton" in lowered:
        return "triton"
    return "other"


def kernel_family(name: str) -> str:
    """A generated kernel's name without its serial number (`triton_red_fused_sum_12` -> `triton_red_fused_sum`),
    so that the many one-call kernels of a big graph add up by what they do."""
    return re.sub(r"_\d+$", "", name)


def profile_one(bench, model_name: str, compiler: str, steps: int, warmup: int, top_n: int = 12) -> dict:
    step = build_step(bench, model_name, *harness_compiler(compiler))
    return {"model": model_name, "compiler": compiler, **profile_steps(step, steps, warmup, top_n)}


def profile_steps(step, steps: int, warmup: int, top_n: int = 12) -> dict:
    """Warm `step` up, profile `steps` calls of it, and split the step's wall time into kernel kinds and gaps."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    by_kind = dict.fromkeys(KINDS, 0.0)
    kernels = 0
    top: dict[str, float] = {}
    calls: dict[str, int] = {}
    families: dict[str, float] = {}
    family_calls: dict[str, int] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = getattr(event, "device_time", event.cuda_time) / 1e3 / steps
        by_kind[kernel_kind(event.name)] += ms
        top[event.name] = top.get(event.name, 0.0) + ms
        calls[event.name] = calls.get(event.name, 0) + 1
        family = kernel_family(event.name)
        families[family] = families.get(family, 0.0) + ms
        family_calls[family] = family_calls.get(family, 0) + 1
        kernels += 1
    busy = sum(by_kind.values())
    return {"step_ms": wall_ms, "kernel_ms": busy,
            "gaps_ms": max(wall_ms - busy, 0.0), "kernels_per_step": kernels / steps,
            "by_kind_ms": by_kind,
            "top_kernels_ms": dict(sorted(top.items(), key=lambda kv: -kv[1])[:top_n]),
            "top_kernel_calls_per_step": {name: calls[name] / steps
                                          for name in sorted(top, key=lambda n: -top[n])[:top_n]},
            "families_ms": {name: [round(families[name], 4), family_calls[name] / steps]
                            for name in sorted(families, key=lambda n: -families[n])[:3 * top_n]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", required=True, help="path to models_bench.py")
    parser.add_argument("--models", default="bert_infer_bf16,gpt2_train")
    parser.add_argument("--compilers", default="eager,torch,kiln",
                        help="bench compilers, and kiln-ro (kiln with mode='reduce-overhead')")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=12, help="how many of the longest kernels to list")
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    bench = load_bench(options.bench)
    rows = []
    for model_name in options.models.split(","):
        for compiler in options.compilers.split(","):
            bench.reset_compiler_state()
            try:
                row = profile_one(bench, model_name, compiler, options.steps, options.warmup, options.top)
            except Exception as e:  # one failure must not lose the others' rows
                row = {"model": model_name, "compiler": compiler, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            if "error" in row:
                print(f"{model_name:<18} {compiler:<6} ERROR {row['error']}")
                continue
            kinds = "  ".join(f"{k} {row['by_kind_ms'][k]:7.2f}" for k in KINDS)
            print(f"{model_name:<18} {compiler:<6} step {row['step_ms']:7.2f} ms = kernels {row['kernel_ms']:7.2f} "
                  f"({kinds}) + gaps {row['gaps_ms']:6.2f}; {row['kernels_per_step']:.0f} kernels/step", flush=True)
    write_json(options.out, {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows})


if __name__ == "__main__":
    main()

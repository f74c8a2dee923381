"""A LayerNorm and an RMSNorm block's training step (forward and backward, bf16 autocast): kiln against eager
and torch.compile, with what each compiled forward saves for the backward.

The blocks are a pre-norm sublayer's input side: a residual stream h = x + linear(x) (float32 under autocast, as
in a Hugging Face decoder with float32 weights) or a bf16 linear's output, its norm, and the linear the norm
feeds; the loss is the mean square of that linear's output. Sizes: GPT-2's (LayerNorm, width 768) and a
Llama-style decoder's (RMSNorm written as transformers' LlamaRMSNorm, width 2048), 8 x 1024 tokens.

What the partition saves decides the traffic of both passes: a forward that saves the float32 normalized input
(x - mean) * rstd writes it, and the backward reads it back; recomputing it inside the norm's backward kernel,
from the input and the per-row mean and rstd the forward saves, writes nothing more (Inductor's partitioner,
and kiln's since 454d146). Reported per block and compiler: milliseconds per step (CUDA events, median), peak
memory of the step over what the model and inputs hold (on the CPU, from the allocator's events), and for
kiln the tensors and bytes its forward saves.

    PYTHONPATH=. python benchmarks/norm_blocks.py --out X.json              # a GPU; about a minute on an H100
    PYTHONPATH=. python benchmarks/norm_blocks.py --device cpu --rows 256    # try it without one (C++ target)
"""
from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import time

import torch
import torch.nn as nn

import common  # benchmarks run strict: KILN_STRICT=1
import kiln
from kiln.pipeline import inductor

BF16 = torch.bfloat16


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, as written there."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


class NormBlock(nn.Module):
    """The norm of a residual stream (`stream`) or of a bf16 linear's output, then the linear it feeds."""

    def __init__(self, norm: nn.Module, width: int, stream: bool):
        super().__init__()
        self.lin0, self.norm, self.lin1, self.stream = nn.Linear(width, width), norm, nn.Linear(width, width), stream

    def forward(self, x):
        h = x + self.lin0(x) if self.stream else self.lin0(x)
        return self.lin1(self.norm(h)).float().pow(2).mean()


BLOCKS = {  # name: (norm, width)
    "gpt2_layernorm": (lambda d: nn.LayerNorm(d), 768),
    "llama_rmsnorm": (lambda d: RMSNorm(d), 2048),
}


def compiled(model: nn.Module, compiler: str, record: list):
    """`model` as `compiler` runs it; kiln's partitions are appended to `record`."""
    if compiler == "eager":
        return model
    if compiler == "torch":
        return torch.compile(model)

    def backend(gm, example_inputs):
        result = inductor(gm, example_inputs)
        record.append(result)
        return result
    return kiln.compile(model, backend=backend)


def step_time_ms(step, device: str, warmup: int, runs: int) -> float:
    if device == "cuda":
        return common.cuda_time(step, warmup, runs)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(block: str, stream: bool, compiler: str, rows: int, device: str, warmup: int, runs: int) -> dict:
    make_norm, width = BLOCKS[block]
    torch.manual_seed(0)
    model = NormBlock(make_norm(width), width, stream).to(device)
    x = torch.randn(rows, width, device=device)
    record: list = []
    fn = compiled(copy.deepcopy(model), compiler, record)
    params = list(fn.parameters())

    def step():
        for p in params:
            p.grad = None
        with torch.autocast(device, dtype=BF16):
            loss = fn(x)
        loss.backward()

    step()  # compiles
    if device == "cpu":
        step()  # lazy allocations out of the measured step
        for p in params:
            p.grad = None
        cpu_peak = common.cpu_allocation_profile(step)[1]
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    ms = step_time_ms(step, device, warmup, runs)
    row = {"block": block, "input": "stream fp32" if stream else "bf16", "compiler": compiler, "rows": rows,
           "width": width, "ms": round(ms, 4)}
    if device == "cuda":
        row["peak_mib"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
    else:  # the CPU allocator's events (no peak statistic there): the step after the warm-up steps
        row["peak_mib"] = round(cpu_peak / 2**20, 1)
    partitions = [p for r in record for p in r.partitions.values()]
    if partitions:
        (split,) = partitions
        row["kiln_saved"] = len(split.saved)
        row["kiln_saved_mib"] = round((split.saved_bytes - split.saved_input_bytes) / 2**20, 2)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| block | input | compiler | ms | vs eager | peak MiB | kiln saved MiB |",
             "|---|---|---|---|---|---|---|"]
    eager = {(r["block"], r["input"]): r["ms"] for r in rows if r["compiler"] == "eager"}
    for r in rows:
        base = eager.get((r["block"], r["input"]))
        speedup = f"{base / r['ms']:.2f}x" if base else "-"
        lines.append(f"| {r['block']} | {r['input']} | {r['compiler']} | {r['ms']} | {speedup} | "
                     f"{r.get('peak_mib', '-')} | {r.get('kiln_saved_mib', '-')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--rows", type=int, default=8 * 1024, help="tokens per step (default 8 x 1024)")
    parser.add_argument("--compilers", default="eager,torch,kiln")
    parser.add_argument("--runs", type=int, default=None, help="timed steps (default 100 GPU, 5 CPU)")
    parser.add_argument("--out", default=None, help="write the rows as JSON")
    args = parser.parse_args()
    runs = args.runs or (100 if args.device == "cuda" else 5)
    cases = itertools.product(BLOCKS, (True, False), args.compilers.split(","))
    rows = common.run_rows(cases, lambda block, stream, compiler: measure(
        block, stream, compiler, args.rows, args.device, warmup=10 if runs > 10 else 1, runs=runs))
    print(table(rows))
    common.write_rows(args.out, rows, args.device)


if __name__ == "__main__":
    main()

"""A training step's reduction kernels, one graph at a time: kiln against eager and torch.compile.

The graphs (ATen, as kiln's AOT stage hands them to the code generator):
  ln_backward   layer norm's backward with its weight and bias gradients: a row reduction per token
                (grad_input) and two column sums over the tokens (weight, bias), bf16 gradient and input,
                float32 weight (bf16 autocast), grad_input rounded back to bf16;
  gelu_bias     GELU's backward (erf form) on bf16 activations, stored, and its column sum (the bias gradient
                of the matmul before it) in float32;
  column_sum    a bf16 gradient summed over its rows (a linear layer's bias gradient);
  bn_nhwc       batch norm's weight and bias gradients over channels-last bf16 activations (column sums of
                N*H*W rows per channel, the NHWC layout kiln's convolutions use in training).
Sizes: DeiT-small's training step (batch 64 x 197 tokens, widths 384 and 1536, as benchmarks/zoo's
timm_deit_train_bf16), BERT-base's (8 x 512 tokens, widths 768 and 3072) and ConvNeXt-like NHWC activations.

Each graph is compiled by kiln's code generator (kiln.pipeline.compile_aten_graph) and by torch.compile (the
reference), checked against eager (norm-relative error), then timed with CUDA events: the median of many
launches after a warmup, nothing flushed between them. The table gives microseconds per call and the bandwidth
kiln reached (bytes of the inputs read and the outputs written, at least, over its time). The JSON also keeps
each case's kiln kernels (their Launcher lines: block sizes, warps, split counts).

    PYTHONPATH=. python benchmarks/reduction_kernels.py --out X.json        # a GPU; under 3 minutes on an H100
    PYTHONPATH=. python benchmarks/reduction_kernels.py --device cpu        # small sizes, kiln's C++ target
    PYTHONPATH=. python benchmarks/reduction_kernels.py --sweep --no-torch  # kiln under other launch rules

`--sweep` compiles each graph again under variants of the reduction rules' constants
(kiln/codegen/triton/heuristics.py: column tile width and height, the programs a split aims for, one-warp rows
on or off) and prints kiln's time under each: the measurements those constants should be set from. Variants
whose constants this kiln does not have are left out. Compiles skip kiln's graph cache: its key is kiln's
source, not the constants a variant changes.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
import kiln
from kiln.config import config
from kiln.lower.decompositions import decomposition_table
from kiln.pipeline import compile_aten_graph

aten = torch.ops.aten
BF16 = torch.bfloat16
GPU_BATCH = 20             # calls queued behind one sleep
SLEEP_CYCLES = 10_000_000  # a few milliseconds at a GPU's clock: longer than the host takes to queue a batch
ROTATE_BYTES = 256 << 20   # input sets rotated through per case: more than an H100's or H200's L2 cache
MAX_INPUT_SETS = 8
# --sweep: name -> constants of kiln/codegen/triton/heuristics.py set while compiling (the first: as they are)
SWEEP = {
    "rules": {},
    "col 32 wide": {"COLUMN_XBLOCK": 32},
    "col 128 wide": {"COLUMN_XBLOCK": 128, "COLUMN_TILE": 4096},
    "col 64x16": {"COLUMN_TILE": 1024},
    "col 64x64": {"COLUMN_TILE": 4096},
    "split 512": {"COLUMN_SPLIT_PROGRAMS": 512},
    "split 2048": {"COLUMN_SPLIT_PROGRAMS": 2048},
    "rows multi-warp": {"WARP_ROW_MIN_XNUMEL": 1 << 62},
}


def ln_backward(grad, x, weight, bias, mean, rstd):
    grad_input, grad_weight, grad_bias = aten.native_layer_norm_backward(
        grad.float(), x.float(), [x.shape[-1]], mean, rstd, weight, bias, [True, True, True])
    return grad_input.to(grad.dtype), grad_weight, grad_bias


def gelu_bias(grad, h):
    grad_h = aten.gelu_backward(grad, h)
    return grad_h, grad_h.float().sum(0)


def column_sum(grad):
    return grad.float().sum(0)


def bn_nhwc(grad, x, weight, mean, invstd):
    _, grad_weight, grad_bias = aten.native_batch_norm_backward(
        grad.float(), x.float(), weight, None, None, mean, invstd, True, 1e-5, [False, True, True])
    return grad_weight, grad_bias


def ln_inputs(rows: int, width: int, device: str):
    x = torch.randn(rows, width, device=device).to(BF16)
    weight, bias = torch.rand(width, device=device) + 0.5, torch.randn(width, device=device)
    _, mean, rstd = aten.native_layer_norm(x.float(), [width], weight, bias, 1e-5)
    return [torch.randn(rows, width, device=device).to(BF16), x, weight, bias, mean, rstd]


def gelu_inputs(rows: int, width: int, device: str):
    return [torch.randn(rows, width, device=device).to(BF16), torch.randn(rows, width, device=device).to(BF16)]


def bn_inputs(n: int, c: int, side: int, device: str):
    grad, x = (torch.randn(n, c, side, side, device=device).to(BF16).contiguous(memory_format=torch.channels_last)
               for _ in range(2))
    _, mean, invstd = aten.native_batch_norm(x.float(), None, None, None, None, True, 0.1, 1e-5)
    return [grad, x, torch.rand(c, device=device) + 0.5, mean, invstd]


def cases(device: str) -> list[tuple[str, str, object, object]]:
    """(graph, shape, function, a maker of its inputs) at the sizes of the module docstring (small ones on the
    CPU)."""
    deit, bert = (64 * 197, 384, 1536), (8 * 512, 768, 3072)
    nhwc = [(64, 96, 56), (64, 192, 28)]
    if device == "cpu":
        deit, bert, nhwc = (197 * 2, 96, 384), (256, 64, 256), [(4, 24, 14)]
    out = []
    for label, (rows, width, hidden) in (("deit", deit), ("bert", bert)):
        out.append(("ln_backward", f"{label} [{rows}, {width}]", ln_backward,
                    functools.partial(ln_inputs, rows, width, device)))
        out.append(("gelu_bias", f"{label} [{rows}, {hidden}]", gelu_bias,
                    functools.partial(gelu_inputs, rows, hidden, device)))
        out.append(("column_sum", f"{label} [{rows}, {width}]", column_sum,
                    lambda rows=rows, width=width: gelu_inputs(rows, width, device)[:1]))
    for n, c, side in nhwc:
        out.append(("bn_nhwc", f"[{n}, {c}, {side}, {side}] NHWC", bn_nhwc, functools.partial(bn_inputs, n, c, side,
                                                                                              device)))
    return out


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def kiln_compiled(fn, inputs):
    """`fn` through kiln's code generator on the inputs' device (Triton on a GPU, C++ on the CPU)."""
    with torch.no_grad():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    compiled = compile_aten_graph(gm, list(inputs), None)
    if "fallback" in compiled.artefacts:
        raise SystemExit(f"kiln fell back to ATen: {compiled.artefacts['fallback']}")
    return compiled


def kernels_of(compiled) -> list[str]:
    """kiln's kernel launch configurations (their Launcher lines), for the JSON."""
    source = str(compiled.artefacts.get("kernels.py", ""))
    return [line.split(" = ", 1)[1] for line in source.splitlines() if " = Launcher(" in line]


def outputs(value) -> list:
    """A graph's outputs as a list (kiln returns a tuple where the function returns one tensor)."""
    return [value] if isinstance(value, torch.Tensor) else list(value)


def relative_error(got, expected) -> float:
    got, expected = outputs(got), outputs(expected)
    assert len(got) == len(expected), (len(got), len(expected))
    worst = 0.0
    for g, e in zip(got, expected):
        e64 = e.double()
        worst = max(worst, ((g.double() - e64).norm() / e64.norm().clamp_min(1e-30)).item())
    return worst


def median_us(fn, input_sets: list, device: str, warmup: int, runs: int) -> float:
    """The median time of one call of `fn`, rotating over `input_sets` (so that no call finds its inputs in the
    L2 cache from the call before). On a GPU: CUDA events around each call, the calls queued behind a sleeping
    kernel in batches, so the events time the GPU's work and not the host's launches (a compiled graph's
    wrapper can take longer to launch a kernel than the kernel runs); nothing is flushed. On the CPU: the wall
    clock."""
    for k in range(warmup):
        fn(*input_sets[k % len(input_sets)])
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for first in range(0, runs, GPU_BATCH):
            torch.cuda._sleep(SLEEP_CYCLES)
            events = []
            for k in range(first, min(runs, first + GPU_BATCH)):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*input_sets[k % len(input_sets)])
                end.record()
                events.append((start, end))
            torch.cuda.synchronize()
            times += [start.elapsed_time(end) * 1e3 for start, end in events]
    else:
        for k in range(runs):
            t = time.perf_counter()
            fn(*input_sets[k % len(input_sets)])
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def commit() -> str:
    """The commit of the kiln measured (its checkout's HEAD; "unknown" for a copy outside git, as a baseline
    unpacked with `git archive`)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(kiln.__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def run_case(graph: str, shape: str, fn, make_inputs, device: str, with_torch: bool, warmup: int,
             runs: int) -> dict:
    inputs = make_inputs()
    with torch.no_grad():
        expected = fn(*inputs)
        kiln_fn = kiln_compiled(fn, inputs)
        got = kiln_fn(*inputs)
        size = nbytes(inputs) + nbytes(outputs(expected))
        row = {"graph": graph, "shape": shape, "bytes": size, "kiln_rel_err": relative_error(got, expected),
               "kiln_kernels": kernels_of(kiln_fn)}
        tol = 2e-2  # bf16 outputs, and float32 sums over thousands of rows added in another order
        if row["kiln_rel_err"] > tol:
            raise SystemExit(f"{graph} {shape}: kiln's relative error {row['kiln_rel_err']:.2e} > {tol}")
        compilers = {"eager": fn, "kiln": kiln_fn}
        if with_torch:
            compilers["torch"] = torch.compile(fn, dynamic=False)
            row["torch_rel_err"] = relative_error(compilers["torch"](*inputs), expected)
        # enough input sets to overflow the L2 cache between two uses of one
        input_sets = [inputs] + [make_inputs() for _ in range(min(MAX_INPUT_SETS, ROTATE_BYTES // size + 1) - 1)]
        for name, f in compilers.items():
            row[f"{name}_us"] = median_us(f, input_sets, device, warmup, runs)
    row["kiln_GBps"] = row["bytes"] / row["kiln_us"] / 1e3
    return row


@contextlib.contextmanager
def heuristics_set(constants: dict):
    """kiln's launch-rule constants set to `constants` within the block (and its graph cache off)."""
    from kiln.codegen.triton import heuristics

    saved = {name: getattr(heuristics, name) for name in constants}
    cached, config.graph_cache = config.graph_cache, False
    try:
        for name, value in constants.items():
            setattr(heuristics, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(heuristics, name, value)
        config.graph_cache = cached


def sweep_case(fn, make_inputs, device: str, warmup: int, runs: int) -> dict:
    """kiln's time (us) for `fn` under each SWEEP variant this kiln has the constants of."""
    from kiln.codegen.triton import heuristics

    inputs = make_inputs()
    size = nbytes(inputs)
    input_sets = [inputs] + [make_inputs() for _ in range(min(MAX_INPUT_SETS, ROTATE_BYTES // size + 1) - 1)]
    out = {}
    for name, constants in SWEEP.items():
        if not all(hasattr(heuristics, c) for c in constants):
            continue
        with heuristics_set(constants), torch.no_grad():
            compiled = kiln_compiled(fn, inputs)
            out[name] = median_us(compiled, input_sets, device, warmup, runs)
    return out


def sweep_table(rows: list[dict]) -> str:
    names = [n for n in SWEEP if any(n in r["sweep_us"] for r in rows)]
    lines = ["| graph | shape | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for r in rows:
        cells = [f"{r['sweep_us'][n]:.1f}" if n in r["sweep_us"] else "-" for n in names]
        lines.append(f"| {r['graph']} | {r['shape']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| graph | shape | eager us | torch.compile us | kiln us | kiln GB/s | kiln / torch |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        torch_us = r.get("torch_us")
        ratio = f"{r['kiln_us'] / torch_us:.2f}" if torch_us else "-"
        torch_cell = f"{torch_us:.1f}" if torch_us else "-"
        lines.append(f"| {r['graph']} | {r['shape']} | {r['eager_us']:.1f} | {torch_cell} | {r['kiln_us']:.1f} | "
                     f"{r['kiln_GBps']:.0f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", default=None, help="write the rows and the machine as JSON")
    parser.add_argument("--only", default=None, help="only the graphs whose name contains this")
    parser.add_argument("--no-torch", action="store_true", help="skip torch.compile (its compiles take longest)")
    parser.add_argument("--runs", type=int, default=None, help="timed calls per compiler (default 200 GPU, 10 CPU)")
    parser.add_argument("--sweep", action="store_true", help="also time kiln under variants of its launch rules")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("reduction_kernels.py: no CUDA GPU here. Run it on a GPU, or with --device cpu for a small smoke "
                 "run of kiln's C++ target.")
    gpu = args.device == "cuda"
    runs = args.runs or (200 if gpu else 10)
    print(f"kiln from {Path(kiln.__file__).parent} (commit {commit()})", flush=True)
    rows = []
    for graph, shape, fn, make_inputs in cases(args.device):
        if args.only and args.only not in graph:
            continue
        row = run_case(graph, shape, fn, make_inputs, args.device, not args.no_torch, 20 if gpu else 2, runs)
        if args.sweep:
            row["sweep_us"] = sweep_case(fn, make_inputs, args.device, 20, runs)
        rows.append(row)
        torch_us = f"{row['torch_us']:9.1f}" if "torch_us" in row else f"{'-':>9s}"
        print(f"{graph:12s} {shape:28s} eager {row['eager_us']:9.1f} us  torch {torch_us} us  "
              f"kiln {row['kiln_us']:9.1f} us  {row['kiln_GBps']:7.0f} GB/s  err {row['kiln_rel_err']:.1e}",
              flush=True)
    print()
    print(table(rows))
    if any("sweep_us" in r for r in rows):
        print()
        print("kiln us under variants of its launch rules (--sweep):")
        print(sweep_table(rows))
    if args.out:
        machine = torch.cuda.get_device_name() if gpu else "cpu"
        with open(args.out, "w") as f:
            json.dump({"device": machine, "torch": torch.__version__, "commit": commit(),
                       "kiln": str(Path(kiln.__file__).parent), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""Training BatchNorm + ReLU on the GPU at DenseNet-121's shapes (batch 64): kiln's Triton kernels with the
statistics reductions split across programs (`heuristics.ROW_SPLIT_PROGRAMS`, for rows of at least
ROW_SPLIT_MIN_RNUMEL values), the same kernels with the earlier threshold (a row reduction split only below
MIN_PROGRAMS // 2 programs, so 128 channels ran as 128 programs walking N*H*W values each), and eager.

Forward and backward are traced separately (aten.native_batch_norm and its backward, decomposed as in a
training graph), compiled with kiln's code generator, checked against eager (norm-relative error), then
timed with CUDA events (triton.testing.do_bench, median).

`--channels-last` takes the activations channels-last, as a training graph whose convolutions run channels-last
holds them (kiln/lower/conv_layout.py): the statistics are then column reductions.

    python benchmarks/batchnorm_kernels.py [--dtype bfloat16] [--channels-last] [--out bn.json]
"""
from __future__ import annotations

import argparse
import functools
import json

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
from kiln.codegen.triton import heuristics
from kiln.lower.decompositions import decomposition_table
from kiln.pipeline import compile_aten_graph

aten = torch.ops.aten
EPS = 1e-5
# (channels, height = width) of DenseNet-121's batch norms: stem, each block's bottleneck (128) and its widest input
SHAPES = [(64, 112), (128, 56), (256, 56), (128, 28), (512, 28), (128, 14), (1024, 14), (128, 7), (1024, 7)]


def forward(x, weight, bias):
    out, mean, invstd = aten.native_batch_norm(x, weight, bias, None, None, True, 0.1, EPS)
    return torch.relu(out), mean, invstd


def backward(grad, y, x, weight, mean, invstd):
    grad = torch.where(y > 0, grad, 0)
    return aten.native_batch_norm_backward(grad, x, weight, None, None, mean, invstd, True, EPS, [True, True, True])


def compiled(fn, inputs, split_programs: int):
    """`fn` through kiln's GPU code generator, row reductions split below `split_programs` programs."""
    saved = heuristics.ROW_SPLIT_PROGRAMS
    heuristics.ROW_SPLIT_PROGRAMS = split_programs
    try:
        with torch.no_grad():
            gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
        return compile_aten_graph(gm, list(inputs), None)
    finally:
        heuristics.ROW_SPLIT_PROGRAMS = saved


def _training_step(fwd, bwd, x, weight, bias, grad):
    """One forward and its backward, the step the benchmark times for each variant."""
    y, mean, invstd = fwd(x, weight, bias)
    return (y, *bwd(grad, y, x, weight, mean, invstd))


def main() -> None:
    import triton.testing

    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--channels-last", action="store_true", help="activations in channels-last memory")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    variants = {"looped": heuristics.MIN_PROGRAMS, "split": heuristics.ROW_SPLIT_PROGRAMS}
    rows = []
    print(f"{'shape':>22s} {'dtype':>9s}  {'fwd+bwd us:':12s} {'looped':>8s} {'split':>8s} {'eager':>8s}")
    for channels, side in SHAPES:
        x = torch.randn(64, channels, side, side, device="cuda", dtype=dtype).contiguous(memory_format=layout)
        weight = torch.rand(channels, device="cuda", dtype=dtype) + 0.5
        bias = torch.randn(channels, device="cuda", dtype=dtype)
        grad = torch.randn_like(x)
        y, mean, invstd = forward(x, weight, bias)
        expected = (y, *backward(grad, y, x, weight, mean, invstd))
        steps = {"eager": (forward, backward)}
        for name, programs in variants.items():
            steps[name] = (compiled(forward, [x, weight, bias], programs),
                           compiled(backward, [grad, y, x, weight, mean, invstd], programs))
        times = {}
        # |got - eager| / |eager|: a bf16 sum over 800K values differs from eager's by an ulp of its largest
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-3
        for name, (fwd, bwd) in steps.items():
            step = functools.partial(_training_step, fwd, bwd, x, weight, bias, grad)
            # each half checked on eager's inputs: a ReLU output rounded to either side of 0 would flip one
            # element of the backward's mask
            got = (*fwd(x, weight, bias), *bwd(grad, y, x, weight, mean, invstd))
            for g, e in zip(got, (y, mean, invstd, *expected[1:])):
                error = ((g.double() - e.double()).norm() / e.double().norm()).item()
                assert error < tol, f"{name}: relative error {error:.2e} over {tuple(e.shape)}"
            times[name] = triton.testing.do_bench(step, warmup=50, rep=300, return_mode="median") * 1e3
        rows.append({"channels": channels, "side": side, "dtype": args.dtype, "channels_last": args.channels_last,
                     "us": times})
        shape = f"64x{channels}x{side}x{side}"
        print(f"{shape:>22s} {args.dtype:>9s}  {'':12s} "
              f"{times['looped']:8.1f} {times['split']:8.1f} {times['eager']:8.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

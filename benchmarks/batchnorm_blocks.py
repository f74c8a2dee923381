"""BatchNorm2d training blocks on the GPU at ResNet-50's layer shapes (batch 256, bf16 autocast): one training step
(forward and backward) of each block, eager, torch.compile and kiln timed in the same process.

Blocks:
  conv_bn_relu   a 1x1 convolution (from max(64, C/4) channels, as a bottleneck's last one), BatchNorm2d, ReLU;
  residual_down  a bottleneck's output side: conv -> BN, a downsample conv -> BN on the block's input, their sum
                 and ReLU. Both batch norms reduce over the same N*H*W per channel: their statistics, and in the
                 backward their sums over the one masked gradient, fuse into one kernel (one loop; see
                 kiln/schedule/fusion.py, `merge_independent_segments`).
Shapes (N, C, H, W): (256, 64, 56, 56), (256, 256, 56, 56), (256, 512, 28, 28), (256, 2048, 7, 7); the input and
the weights NCHW or channels-last (`--layouts`). The loss is the mean square of the block's output in float32.

Each compiler's step is checked once against eager (loss and every parameter gradient, norm-relative error), then
timed with CUDA events (median). `--profile` adds, per kiln and torch.compile step, the GPU time of its Triton
kernels and its longest kernels (torch.profiler), to compare the batch-norm reductions one by one.

    PYTHONPATH=. python benchmarks/batchnorm_blocks.py --out bn_blocks.json [--profile]    # a GPU
    PYTHONPATH=. python benchmarks/batchnorm_blocks.py --blocks conv_bn_relu --shapes 256x64x56x56 --layouts nhwc
    PYTHONPATH=. python benchmarks/batchnorm_blocks.py --device cpu --shapes 4x64x14x14 --runs 2  # no GPU: a try
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn as nn
from gpu_profile import profile_steps
from norm_blocks import step_time_ms

import common  # benchmarks run strict: KILN_STRICT=1
import kiln

SHAPES = ["256x64x56x56", "256x256x56x56", "256x512x28x28", "256x2048x7x7"]


class ConvBnRelu(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.inputs = max(64, channels // 4)
        self.conv = nn.Conv2d(self.inputs, channels, 1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class ResidualDown(nn.Module):
    """conv -> BN on the main path, conv -> BN on the downsample path, summed, then ReLU (a ResNet bottleneck's
    first block after its 3x3 convolution; the downsample conv computed after the main one, as timm and
    torchvision do)."""

    def __init__(self, channels: int):
        super().__init__()
        self.inputs = max(64, channels // 4)
        self.conv = nn.Conv2d(self.inputs, channels, 1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.down = nn.Conv2d(self.inputs, channels, 1, bias=False)
        self.bn_down = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(y + self.bn_down(self.down(x)))


BLOCKS = {"conv_bn_relu": ConvBnRelu, "residual_down": ResidualDown}


def compiled(model: nn.Module, compiler: str):
    if compiler == "eager":
        return model
    if compiler == "torch":
        return torch.compile(model)
    return kiln.compile(model)


def training_step(model: nn.Module, x: torch.Tensor):
    """One step: the loss and the parameters' gradients (set to None first)."""
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        return loss
    return step


def relative_error(model: nn.Module, reference: nn.Module, loss, reference_loss) -> float:
    """The largest norm-relative error of the loss and of each parameter's gradient against eager's."""
    pairs = [(loss, reference_loss)] + [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters())]
    return max(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item() for a, b in pairs)


def measure(block: str, shape: str, layout: str, compiler: str, device: str, runs: int, profile: bool) -> dict:
    n, c, h, w = (int(v) for v in shape.split("x"))
    torch.manual_seed(0)
    reference = BLOCKS[block](c).to(device)
    x = torch.randn(n, reference.inputs, h, w, device=device)
    if layout == "nhwc":
        reference = reference.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model = BLOCKS[block](c).to(device)
    model.load_state_dict(reference.state_dict())
    model = model.to(memory_format=torch.channels_last) if layout == "nhwc" else model
    step = training_step(compiled(model, compiler), x)
    error = relative_error(model, reference, step(), training_step(reference, x)())
    row = {"block": block, "shape": shape, "layout": layout, "compiler": compiler,
           "ms": round(step_time_ms(step, device, warmup=5, runs=runs), 4), "max_rel_error": float(f"{error:.3g}")}
    if profile and compiler != "eager" and device == "cuda":
        add_kernel_profile(row, step, top_n=6)
    return row


def add_kernel_profile(row: dict, step, top_n: int) -> None:
    """A compiled step's Triton milliseconds and its longest kernels, into its row (GPU only)."""
    found = profile_steps(step, steps=5, warmup=2, top_n=top_n)
    row["triton_ms"] = round(found["by_kind_ms"]["triton"], 4)
    row["top_kernels_ms"] = {name[:80]: round(ms, 4) for name, ms in found["top_kernels_ms"].items()}


def table(rows: list[dict], variant: str = "layout") -> str:
    """The rows as markdown, each beside eager's row of the same block, shape and `variant` (layout, dtype)."""
    lines = [f"| block | shape | {variant} | compiler | ms | vs eager | triton ms | max rel error |",
             "|---|---|---|---|---|---|---|---|"]
    eager = {(r["block"], r["shape"], r[variant]): r["ms"] for r in rows if r["compiler"] == "eager"}
    for r in rows:
        base = eager.get((r["block"], r["shape"], r[variant]))
        speedup = f"{base / r['ms']:.2f}x" if base else "-"
        lines.append(f"| {r['block']} | {r['shape']} | {r[variant]} | {r['compiler']} | {r['ms']} | {speedup} | "
                     f"{r.get('triton_ms', '-')} | {r['max_rel_error']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--blocks", default=",".join(BLOCKS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="NxCxHxW, comma separated")
    parser.add_argument("--layouts", default="nchw,nhwc")
    parser.add_argument("--compilers", default="eager,torch,kiln")
    parser.add_argument("--runs", type=int, default=30, help="timed steps per row")
    parser.add_argument("--profile", action="store_true", help="Triton time and longest kernels per compiled step")
    parser.add_argument("--out", default=None, help="write the rows as JSON")
    args = parser.parse_args()
    cases = itertools.product(args.blocks.split(","), args.shapes.split(","), args.layouts.split(","),
                              args.compilers.split(","))
    rows = common.run_rows(cases, lambda *case: measure(*case, args.device, args.runs, args.profile))
    print(table(rows))
    common.write_rows(args.out, rows, args.device)


if __name__ == "__main__":
    main()

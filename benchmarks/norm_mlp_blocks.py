"""A transformer's norm + MLP sublayer in training (forward and backward), at decoder and ViT sizes: eager,
torch.compile and kiln timed in the same process, with `--profile` for the Triton time and the longest kernels.

Blocks (the residual stream h = x + linear(x), then the pre-norm MLP sublayer h + mlp(norm(h))):
  rmsnorm_swiglu    transformers' LlamaRMSNorm and Llama's gated MLP down(silu(gate(n)) * up(n)), no biases: the
                    norm's forward (a row reduction), SiLU and its backward, and the norm's backward: grad_h (a
                    row reduction over the width) and the weight's gradient (a column sum over every token);
  layernorm_gelu    nn.LayerNorm and a ViT/DeiT MLP fc2(gelu(fc1(n))) with biases: layer norm forward and
                    backward, GELU's backward with fc1's bias gradient (a column sum in the same kernel).
Shapes (tokens x width x MLP width): the zoo's Llama (8 x 1024 tokens, 768, 2048), a 1B-class decoder's width
(4 x 1024 tokens, 2048, 5632), DeiT-small and ViT-base at batch 64 (64 x 197 tokens, 384 and 768 wide).
`--dtypes`: bf16 (autocast over float32 weights and a float32 stream, as the zoo trains) and fp32 (no autocast).
The loss is the mean square of the block's output in float32.

Each compiler's step is checked once against eager (the loss and every parameter gradient, norm-relative error),
then timed with CUDA events (median). With `--profile`, each compiled step's Triton time and longest kernels
(torch.profiler), to compare the norm, SiLU and GELU kernels one by one with torch.compile's.

    PYTHONPATH=. python benchmarks/norm_mlp_blocks.py --profile --out X.json                # a GPU
    PYTHONPATH=. python benchmarks/norm_mlp_blocks.py --blocks rmsnorm_swiglu --shapes 8192x768x2048 --dtypes bf16
    PYTHONPATH=. python benchmarks/norm_mlp_blocks.py --device cpu --shapes 256x64x128 --runs 2  # no GPU: a try
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn as nn
import torch.nn.functional as F
from batchnorm_blocks import add_kernel_profile, relative_error, table
from norm_blocks import RMSNorm, step_time_ms

import common  # benchmarks run strict: KILN_STRICT=1

SHAPES = ["8192x768x2048", "4096x2048x5632", "12608x384x1536", "12608x768x3072"]
DTYPES = {"bf16": torch.bfloat16, "fp32": None}


class NormMlp(nn.Module):
    """h = x + lin0(x) (the residual stream), then h + mlp(norm(h))."""

    def __init__(self, width: int, hidden: int, gated: bool):
        super().__init__()
        self.gated = gated
        self.lin0 = nn.Linear(width, width, bias=not gated)
        self.norm = RMSNorm(width) if gated else nn.LayerNorm(width)
        self.fc = nn.Linear(width, hidden, bias=not gated)
        self.up = nn.Linear(width, hidden, bias=False) if gated else None
        self.out = nn.Linear(hidden, width, bias=not gated)

    def forward(self, x):
        h = x + self.lin0(x)
        n = self.norm(h)
        a = F.silu(self.fc(n)) * self.up(n) if self.gated else F.gelu(self.fc(n))
        return h + self.out(a)


BLOCKS = {"rmsnorm_swiglu": True, "layernorm_gelu": False}  # name: gated (Llama's) or not (ViT's)


def training_step(model: nn.Module, x: torch.Tensor, amp: torch.dtype | None):
    """One step: the loss and the parameters' gradients (set to None first)."""
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        with torch.autocast(x.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            loss = model(x).float().square().mean()
        loss.backward()
        return loss
    return step


def measure(block: str, shape: str, dtype: str, compiler: str, device: str, runs: int, profile: bool) -> dict:
    tokens, width, hidden = (int(v) for v in shape.split("x"))
    torch.manual_seed(0)
    reference = NormMlp(width, hidden, BLOCKS[block]).to(device)
    model = NormMlp(width, hidden, BLOCKS[block]).to(device)
    model.load_state_dict(reference.state_dict())
    x = torch.randn(tokens, width, device=device)
    amp = DTYPES[dtype]
    step = training_step(common.compiled(model, compiler), x, amp)
    error = relative_error(model, reference, step(), training_step(reference, x, amp)())
    row = {"block": block, "shape": shape, "dtype": dtype, "compiler": compiler,
           "ms": round(step_time_ms(step, device, warmup=5, runs=runs), 4), "max_rel_error": float(f"{error:.3g}")}
    if profile and compiler != "eager" and device == "cuda":
        add_kernel_profile(row, step, top_n=8)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--blocks", default=",".join(BLOCKS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="TOKENSxWIDTHxHIDDEN, comma separated")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--compilers", default="eager,torch,kiln")
    parser.add_argument("--runs", type=int, default=30, help="timed steps per row")
    parser.add_argument("--profile", action="store_true", help="Triton time and longest kernels per compiled step")
    parser.add_argument("--out", default=None, help="write the rows as JSON")
    args = parser.parse_args()
    cases = itertools.product(args.blocks.split(","), args.shapes.split(","), args.dtypes.split(","),
                              args.compilers.split(","))
    rows = common.run_rows(cases, lambda *case: measure(*case, args.device, args.runs, args.profile))
    print(table(rows, variant="dtype"))
    common.write_rows(args.out, rows, args.device)


if __name__ == "__main__":
    main()

"""Which Triton spellings of exp, sigmoid, division, log, sin, cos, exp2 and log2 give eager's CUDA float32 bits.

Each spelling runs over 4M float32 values on the GPU beside eager's op on the same values; the table gives the
share of results whose bits differ and the largest difference in units of the last place. Then it times the
kernels kiln generates for a few memory-bound functions over 16M elements with its spellings (libdevice's expf and
correctly rounded division) beside the same kernels with Triton's approximations (kiln's op table patched in this
process only), in milliseconds per call (`common.cuda_time`):

    python benchmarks/triton_math.py
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

import kiln
from common import cuda_time
from kiln.codegen.triton import ops

APPROXIMATIONS = {"exp": "tl.exp({0})", "sigmoid": "tl.sigmoid({0})", "truediv": "({0} / {1})",
                  "reciprocal": "(1.0 / {0})"}
TIMED = {"exp": lambda x, y: x.exp(), "sigmoid": lambda x, y: x.sigmoid(), "div": lambda x, y: x / y,
         "silu * y": lambda x, y: F.silu(x) * y, "softmax": lambda x, y: x.softmax(-1),
         "bf16 gelu(tanh)": lambda x, y: F.gelu(x.bfloat16(), approximate="tanh")}

# (spelling, eager's op it stands for); the kernel's WHICH is the position
SPELLINGS = [("tl.exp(x)", "exp"), ("libdevice.exp(x)", "exp"), ("tl.sigmoid(x)", "sigmoid"),
             ("1.0 / (1.0 + libdevice.exp(-x))", "sigmoid"),
             ("libdevice.div_rn(1.0, 1.0 + libdevice.exp(-x))", "sigmoid"),
             ("x / y", "div"), ("libdevice.div_rn(x, y)", "div"), ("tl.log(x)", "log"), ("libdevice.log(x)", "log"),
             ("tl.sin(x)", "sin"), ("libdevice.sin(x)", "sin"), ("tl.cos(x)", "cos"), ("libdevice.cos(x)", "cos"),
             ("tl.exp2(x)", "exp2"), ("libdevice.exp2(x)", "exp2"), ("tl.log2(x)", "log2"),
             ("libdevice.log2(x)", "log2")]


@triton.jit
def spelled(x_ptr, y_ptr, out_ptr, n, WHICH: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask)
    y = tl.load(y_ptr + i, mask)
    if WHICH == 0:
        r = tl.exp(x)
    elif WHICH == 1:
        r = libdevice.exp(x)
    elif WHICH == 2:
        r = tl.sigmoid(x)
    elif WHICH == 3:
        r = 1.0 / (1.0 + libdevice.exp(-x))
    elif WHICH == 4:
        r = libdevice.div_rn(1.0, 1.0 + libdevice.exp(-x))
    elif WHICH == 5:
        r = x / y
    elif WHICH == 6:
        r = libdevice.div_rn(x, y)
    elif WHICH == 7:
        r = tl.log(x)
    elif WHICH == 8:
        r = libdevice.log(x)
    elif WHICH == 9:
        r = tl.sin(x)
    elif WHICH == 10:
        r = libdevice.sin(x)
    elif WHICH == 11:
        r = tl.cos(x)
    elif WHICH == 12:
        r = libdevice.cos(x)
    elif WHICH == 13:
        r = tl.exp2(x)
    elif WHICH == 14:
        r = libdevice.exp2(x)
    elif WHICH == 15:
        r = tl.log2(x)
    else:
        r = libdevice.log2(x)
    tl.store(out_ptr + i, r, mask)


def main() -> None:
    n = 1 << 22
    x = torch.randn(n, device="cuda") * 4
    y = torch.randn(n, device="cuda") * 3 + 0.1
    positive = x.abs() + 1e-3
    eager = {"exp": x.exp(), "sigmoid": x.sigmoid(), "div": x / y, "log": positive.log(), "sin": x.sin(),
             "cos": x.cos(), "exp2": x.exp2(), "log2": positive.log2()}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| spelling | eager's | bits differ | most ulps |\n|---|---|---|---|")
    for which, (spelling, op) in enumerate(SPELLINGS):
        out = torch.empty_like(x)
        spelled[(n // 1024,)](positive if op in ("log", "log2") else x, y, out, n, WHICH=which, BLOCK=1024)
        ulps = (out.view(torch.int32) - eager[op].view(torch.int32)).abs()
        print(f"| `{spelling}` | {op} | {(ulps != 0).float().mean().item():.2%} | {ulps.max().item()} |")
    x, y = x.reshape(4096, 1024).repeat(4, 1), y.reshape(4096, 1024).repeat(4, 1)
    print("\n| function | libdevice ms | approximations ms |\n|---|---|---|")
    kept = {name: ops.OPS[name] for name in APPROXIMATIONS}
    kiln.config.graph_cache = False  # each compile generates its kernels from the table as patched
    for name, fn in TIMED.items():
        times = []
        for table in (kept, APPROXIMATIONS):
            ops.OPS.update(table)
            kiln.reset()
            compiled = kiln.compile(fn)
            times.append(cuda_time(lambda compiled=compiled: compiled(x, y), warmup=10, iters=100))
        ops.OPS.update(kept)
        print(f"| {name} | {times[0]:.4f} | {times[1]:.4f} |")


if __name__ == "__main__":
    main()

"""GPU smoke test of kiln's Triton target: correctness vs eager, then eager / kiln / torch.compile timings.

    python benchmarks/gpu_smoke.py [--quick] [--only SUBSTRING] [--json PATH]
    e.g. python3 benchmarks/gpu_smoke.py \\
        --json benchmarks/results/gpu_smoke/$(date -u +%F)_h100_$(git rev-parse --short=7 HEAD).json

Each case compiles a small graph or model three ways (eager, kiln, torch.compile),
checks kiln's outputs (and gradients, for training) against eager, and times each
with CUDA events (median of the timed runs after warm-up). Every case runs inside
try/except: a failure prints its traceback and the table shows it; the script never
aborts. Kiln compiles through `torch.compile(m, backend=kiln.inductor)` (kiln's code
generator behind torch's capture) and through `kiln.compile(m)` (kiln end to end).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kiln  # noqa: E402
from common import cuda_time  # noqa: E402

DEV = "cuda"


def tol(dtype):
    return {torch.float32: 2e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}.get(dtype, 1e-3)


def kernel_time(fn, iters=10) -> float:
    """Milliseconds of GPU kernel time per call (torch.profiler, CUDA activity only): excludes launch gaps."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / iters / 1000


def flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat(v)]
    return []


def compare(got, ref, dtype) -> float:
    """Largest relative error over all outputs (raises if shapes or dtypes differ)."""
    worst = 0.0
    for g, r in zip(flat(got), flat(ref), strict=True):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
        if not r.is_floating_point():
            assert torch.equal(g, r), "integer outputs differ"
            continue
        g, r = g.float(), r.float()
        err = ((g - r).abs() / (r.abs() + 1)).max().item() if r.numel() else 0.0
        worst = max(worst, err)
    return worst


# ----------------------------------------------------------------------------- cases


def pointwise_chain(x, y):
    return ((x * 1.5 + y).relu() * torch.sigmoid(y) - torch.tanh(x)) / (1 + y * y)


def softmax(x):
    return torch.softmax(x, dim=-1)


class LayerNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = nn.LayerNorm(n)

    def forward(self, x):
        return self.ln(x)


class MLP(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(d, h), nn.Linear(h, d), nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(F.gelu(self.fc1(x))))


class ConvNet(nn.Module):
    """conv -> batchnorm -> relu blocks and a pooled linear head (BatchNorm's per-channel reductions)."""

    def __init__(self, c=64):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.head = nn.Linear(c, 3 * 32 * 32)

    def forward(self, x):
        y = self.body(x).mean((2, 3))
        return self.head(y).view_as(x)


class Block(nn.Module):
    """A pre-norm transformer block: layernorm, attention (SDPA), MLP with GELU, residuals."""

    def __init__(self, d=512, heads=8):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def function_cases(quick):
    n = 2048 if quick else 8192
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        x, y = torch.randn(n, 1024, device=DEV, dtype=dtype), torch.randn(n, 1024, device=DEV, dtype=dtype)
        cases.append((f"pointwise chain {name} [{n}x1024]", pointwise_chain, (x, y), dtype))
        cases.append((f"softmax {name} [{n}x1024]", softmax, (x,), dtype))
        cases.append((f"softmax {name} [{n // 8}x8192] (looped)", softmax,
                      (torch.randn(n // 8, 8192, device=DEV, dtype=dtype),), dtype))
        ln = LayerNorm(1024).to(DEV, dtype)
        cases.append((f"layernorm {name} [{n}x1024]", ln, (x,), dtype))
    scale = torch.tensor(0.5)  # a CPU scalar tensor mixed with CUDA tensors, as eager allows
    cases.append(("cpu scalar constant fp32 [4096x1024]", lambda x: (x * scale + 1).relu(),
                  (torch.randn(4096, 1024, device=DEV),), torch.float32))
    cases.append(("sum+argmax fp32 cols [4096x512]", lambda x: (x.sum(0), x.argmax(-1), x.var(-1)),
                  (torch.randn(4096, 512, device=DEV),), torch.float32))
    return cases


def run_inference(name, fn, inputs, dtype, compilers, rows):
    with torch.no_grad():
        ref = fn(*inputs)
        eager = functools.partial(fn, *inputs)
        row = {"case": name, "eager_ms": cuda_time(eager), "eager_gpu_ms": kernel_time(eager)}
        for cname, make in compilers.items():
            try:
                compiled = make(fn)
                t0 = time.perf_counter()
                out = compiled(*inputs)
                torch.cuda.synchronize()
                row[f"{cname}_compile_s"] = time.perf_counter() - t0
                err = compare(out, ref, dtype)
                row[f"{cname}_err"] = err
                if err > tol(dtype):
                    row[f"{cname}_ms"] = f"WRONG ({err:.2g})"
                    continue
                row[f"{cname}_ms"] = cuda_time(functools.partial(compiled, *inputs))
                row[f"{cname}_gpu_ms"] = kernel_time(functools.partial(compiled, *inputs))
            except Exception as e:  # noqa: BLE001  (a smoke test reports, never aborts)
                traceback.print_exc()
                row[f"{cname}_ms"] = f"ERROR {type(e).__name__}: {str(e)[:80]}"
    rows.append(row)


def run_training(name, make_model, x, dtype, compilers, rows):
    torch.manual_seed(0)
    base = make_model()
    target = torch.randn_like(x)

    def step(model):
        def go():
            for p in model.parameters():
                p.grad = None
            loss = F.mse_loss(model(x), target)
            loss.backward()
            return loss
        return go

    eager_step = step(base)
    ref_loss = eager_step().detach()
    ref_grads = [p.grad.clone() for p in base.parameters()]
    row = {"case": name, "eager_ms": cuda_time(eager_step), "eager_gpu_ms": kernel_time(eager_step)}
    for cname, make in compilers.items():
        try:
            compiled = make(base)
            go = step(compiled)
            t0 = time.perf_counter()
            loss = go()
            torch.cuda.synchronize()
            row[f"{cname}_compile_s"] = time.perf_counter() - t0
            err = max(compare(loss.detach(), ref_loss, dtype),
                      compare([p.grad for p in base.parameters()], ref_grads, dtype))
            row[f"{cname}_err"] = err
            if err > tol(dtype) * 5:
                row[f"{cname}_ms"] = f"WRONG ({err:.2g})"
                continue
            row[f"{cname}_ms"] = cuda_time(go)
            row[f"{cname}_gpu_ms"] = kernel_time(go)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row[f"{cname}_ms"] = f"ERROR {type(e).__name__}: {str(e)[:80]}"
    rows.append(row)


def compilers():
    torch._dynamo.reset()
    return {
        "kiln(torch.compile backend)": lambda m: torch.compile(m, backend=kiln.inductor),
        "kiln.compile": lambda m: kiln.compile(m),
        "torch.compile": lambda m: torch.compile(m),
    }


def print_table(rows, names, unit="ms"):
    cols = [f"eager_{unit}"] + [f"{n}_{unit}" for n in names]
    width = max(len(r["case"]) for r in rows) + 2
    head = "case".ljust(width) + "".join(c.replace(f"_{unit}", "").rjust(30) for c in cols)
    print("\n" + head)
    print("-" * len(head))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "-")
            if isinstance(v, float):
                base = r.get(cols[0])
                sp = f" ({base / v:.2f}x)" if c != cols[0] and v > 0 and isinstance(base, float) else ""
                v = f"{v:.3f} ms{sp}"
            cells.append(str(v)[:29].rjust(30))
        print(r["case"].ljust(width) + "".join(cells))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller shapes")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device; nothing to do")
        return
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", end="")
    try:
        import triton
        print(f"  triton {triton.__version__}")
    except ImportError:
        print("  (triton not installed: kiln falls back to ATen on CUDA)")
    torch.manual_seed(0)
    rows: list = []
    names = list(compilers())
    for name, fn, inputs, dtype in function_cases(args.quick):
        if args.only and args.only not in name:
            continue
        print(f"== {name}", flush=True)
        try:
            run_inference(name, fn, inputs, dtype, compilers(), rows)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"case": name, "eager_ms": "ERROR"})
    b = 1024 if args.quick else 8192
    for dtype in (torch.float32, torch.bfloat16):
        name = f"MLP fwd+bwd {str(dtype).replace('torch.', '')} [{b}x1024, h=4096]"
        if args.only and args.only not in name:
            continue
        print(f"== {name}", flush=True)
        try:
            x = torch.randn(b, 1024, device=DEV, dtype=dtype)
            run_training(name, lambda dtype=dtype: MLP(1024, 4096).to(DEV, dtype), x, dtype, compilers(), rows)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"case": name, "eager_ms": "ERROR"})
    more = [("ConvNet fwd+bwd fp32 [32x3x32x32]", lambda: ConvNet().to(DEV), torch.randn(32, 3, 32, 32, device=DEV),
             torch.float32),
            ("transformer block fwd+bwd bf16 [8x512x512]", lambda: Block().to(DEV, torch.bfloat16),
             torch.randn(8, 512, 512, device=DEV, dtype=torch.bfloat16), torch.bfloat16)]
    for name, make_model, x, dtype in more:
        if args.only and args.only not in name:
            continue
        print(f"== {name}", flush=True)
        try:
            run_training(name, make_model, x, dtype, compilers(), rows)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"case": name, "eager_ms": "ERROR"})
    print("\n== wall time per call: median of CUDA-event-timed calls (launch overhead included); "
          "(Nx) = speedup over eager")
    print_table(rows, names, "ms")
    print("\n== GPU kernel time per call (torch.profiler): what the kernels alone take")
    print_table(rows, names, "gpu_ms")
    print("\n(compile times and max errors are in the JSON)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1,
                                              default=str))


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    main()

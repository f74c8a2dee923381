"""CUDA graphs on the GPU: the checks of tests/runtime/test_cudagraphs.py, then per-call latency of a small MLP.

    python benchmarks/cudagraphs_check.py [--skip-tests] [--iters N] [--json PATH]

1. Runs tests/runtime/test_cudagraphs.py under pytest (on a GPU its CUDA cases run: replay
   equals eager, a new shape records again, inputs copied only where needed, a stale output
   raises, training forward+backward under reduce-overhead equals eager, CPU tensors fall back).
2. Times a 4-layer MLP at batch 1 (launch-bound: what CUDA graphs are for), inference and a
   training step, compiled several ways: eager, kiln (default), kiln reduce-overhead, kiln's
   "cudagraphs" backend, torch.compile default and reduce-overhead. Latency is host wall time
   per call (N calls, then a synchronize; median of 5 repeats), each result checked against eager.
   Every case runs inside try/except: a failure prints its traceback and shows in the table.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import common  # noqa: E402,F401  (benchmarks run strict: KILN_STRICT=1)
import kiln  # noqa: E402


class MLP(nn.Module):
    def __init__(self, d=512, h=1024, layers=4):
        super().__init__()
        dims = [d] + [h] * (layers - 1) + [d]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = torch.nn.functional.gelu(x)
        return self.norm(x)


def per_call_us(fn, iters: int, repeats: int = 5) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(times)


def compilers():
    return {
        "eager": lambda m: m,
        "kiln": lambda m: kiln.compile(m),
        "kiln reduce-overhead": lambda m: kiln.compile(m, mode="reduce-overhead"),
        "kiln backend=cudagraphs": lambda m: kiln.compile(m, backend="cudagraphs"),
        "torch.compile": lambda m: torch.compile(m),
        "torch.compile reduce-overhead": lambda m: torch.compile(m, mode="reduce-overhead"),
    }


def time_inference(name, make, iters) -> dict:
    torch.manual_seed(0)
    ref = MLP().cuda().eval()
    model = make(copy.deepcopy(ref))
    x = torch.randn(1, 512, device="cuda")
    with torch.no_grad():
        expected = ref(x)
        start = time.perf_counter()
        got = model(x).clone()
        got = model(x).clone()  # warm-up, then the recording
        compile_s = time.perf_counter() - start
        err = (got - expected).abs().max().item()
        us = per_call_us(lambda: model(x), iters)
    return {"case": "inference b=1", "compiler": name, "us": us, "max_err": err, "first_calls_s": compile_s}


def time_training(name, make, iters) -> dict:
    torch.manual_seed(0)
    ref = MLP().cuda()
    model = copy.deepcopy(ref)
    compiled = make(model)
    x = torch.randn(1, 512, device="cuda")
    opt_ref = torch.optim.SGD(ref.parameters(), lr=1e-3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(net, o):
        o.zero_grad()
        loss = net(x).square().mean()
        loss.backward()
        o.step()
        return loss

    for _ in range(3):  # warm-up, recording, one replay: parameters must still agree
        step(ref, opt_ref)
        step(compiled, opt)
    err = max((p - q).abs().max().item() for p, q in zip(ref.parameters(), model.parameters()))
    us = per_call_us(lambda: step(compiled, opt), iters)
    return {"case": "train step b=1", "compiler": name, "us": us, "max_err": err}


def run_tests() -> int:
    print("== tests/runtime/test_cudagraphs.py", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                            str(ROOT / "tests/runtime/test_cudagraphs.py")], cwd=ROOT, env=env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cudagraphs_check: needs a CUDA GPU")
    rc = 0 if args.skip_tests else run_tests()
    print(f"== tests: {'passed' if rc == 0 else f'FAILED (pytest exit {rc})'}", flush=True)

    rows = []
    for timer in (time_inference, time_training):
        for name, make in compilers().items():
            try:
                rows.append(timer(name, make, args.iters))
            except Exception as e:  # noqa: BLE001  (report and go on)
                traceback.print_exc()
                rows.append({"case": timer.__name__, "compiler": name, "error": f"{type(e).__name__}: {e}"[:200]})
            torch._dynamo.reset()
            kiln.reset()

    print(f"\n{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'case':<16} {'compiler':<30} {'us/call':>9} {'vs eager':>9} {'max err':>9}")
    eager = {r["case"]: r["us"] for r in rows if r.get("compiler") == "eager" and "us" in r}
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<16} {r['compiler']:<30} ERROR {r['error']}")
            continue
        speedup = eager.get(r["case"], float("nan")) / r["us"]
        print(f"{r['case']:<16} {r['compiler']:<30} {r['us']:>9.1f} {speedup:>8.2f}x {r['max_err']:>9.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "tests_rc": rc,
                                               "rows": rows}, indent=1))
    sys.exit(1 if rc else 0)


if __name__ == "__main__":
    main()

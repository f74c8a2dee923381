"""max-autotune on the GPU: matmul + epilogue and reduction workloads, kiln default vs kiln max-autotune.

    python benchmarks/autotune_gpu.py [--only SUBSTRING] [--json PATH] [--no-torch]
    e.g. python benchmarks/autotune_gpu.py \\
        --json benchmarks/results/autotune_gpu/$(date -u +%F)_h100_$(git rev-parse --short=7 HEAD).json

For each workload (inference, torch.no_grad) it compiles:
  kiln default                        kiln.compile(fn)
  kiln max-autotune-no-cudagraphs     kiln.compile(fn, mode="max-autotune-no-cudagraphs")
  torch max-autotune-no-cudagraphs    torch.compile(fn, mode="max-autotune-no-cudagraphs") (the reference)
checks each against eager (largest relative error), times each with CUDA events (median
of the timed runs after warm-up; the first call, which compiles and autotunes, is timed
apart as "first call"), and prints the times and the speedups vs eager and vs torch.
It also says, per kiln max-autotune compile, how many kernels were benchmarked and which
matmuls chose the Triton template over ATen (read from the autotune cache's decisions).
Autotune decisions go to a fresh cache directory unless KILN_CACHE_DIR is set, so the
first call really benchmarks. Every case runs in try/except: a failure is printed and shown
in the table; the script never aborts.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln_autotune_bench_"))

import kiln  # noqa: E402
from common import cuda_time  # noqa: E402
from kiln.runtime import cache  # noqa: E402

DEV = "cuda"
TOL = {torch.float32: 2e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat(v)]
    return []


def rel_error(got, ref) -> float:
    worst = 0.0
    for g, r in zip(flat(got), flat(ref), strict=True):
        if g.shape != r.shape or g.dtype != r.dtype:
            raise AssertionError(f"output {tuple(g.shape)} {g.dtype} vs eager {tuple(r.shape)} {r.dtype}")
        scale = r.float().abs().max().item() or 1.0
        worst = max(worst, (g.float() - r.float()).abs().max().item() / scale)
    return worst


# ----------------------------------------------------------------------------- workloads


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def linear_relu_residual(x, w, b, r):
    return F.relu(F.linear(x, w, b)) + r


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.silu(F.linear(x, w1, b1)), w2, b2)


def bmm_scale_softmax(q, k):
    return (torch.bmm(q, k.transpose(1, 2)) * 0.125).softmax(-1)


def odd_linear(x, w, b):  # K and N not multiples of 8: shape padding's case
    return torch.tanh(F.linear(x, w, b))


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def softmax_rows(x):
    return torch.softmax(x * 2.0, -1)


def column_sum(x):
    return (x * x).sum(0)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def r(*shape, dtype):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def cases(dtype):
    d = dict(dtype=dtype)
    return [
        ("linear+gelu 4096x4096x4096", linear_gelu, lambda: (r(4096, 4096, **d), r(4096, 4096, **d), r(4096, **d))),
        ("linear+relu+residual 8192x1024x1024", linear_relu_residual,
         lambda: (r(8192, 1024, **d), r(1024, 1024, **d), r(1024, **d), r(8192, 1024, **d))),
        ("mlp 2048x1024->4096->1024", mlp,
         lambda: (r(2048, 1024, **d), r(4096, 1024, **d), r(4096, **d), r(1024, 4096, **d), r(1024, **d))),
        ("linear small 64x256x256", linear_gelu, lambda: (r(64, 256, **d), r(256, 256, **d), r(256, **d))),
        ("bmm*scale+softmax 32x512x64", bmm_scale_softmax, lambda: (r(32, 512, 64, **d), r(32, 512, 64, **d))),
        ("linear odd K/N 4096x1000x1003", odd_linear, lambda: (r(4096, 1003, **d), r(1000, 1003, **d), r(1000, **d))),
        ("layernorm 8192x1024", layernorm, lambda: (r(8192, 1024, **d), r(1024, **d), r(1024, **d))),
        ("softmax 4096x4096", softmax_rows, lambda: (r(4096, 4096, **d),)),
        ("column sum 16384x512", column_sum, lambda: (r(16384, 512, **d),)),
        ("rms norm 8192x4096", rms_norm, lambda: (r(8192, 4096, **d), r(4096, **d))),
    ]


# ----------------------------------------------------------------------------- running


def decisions_since(seen: set) -> list[dict]:
    """Autotune decisions written since the last look (the JSON files of kiln's autotune cache)."""
    out = []
    for f in sorted(cache.folder("autotune").rglob("*.json")):
        if f in seen:
            continue
        seen.add(f)
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            pass
    return out


def run_variant(name, make, fn, args, ref, dtype, seen):
    row = {"variant": name}
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            compiled = make(fn)
            out = compiled(*args)
            torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0
            err = rel_error(out, ref)
            row["rel_error"] = err
            row["ok"] = err <= TOL[dtype]
            row["ms"] = cuda_time(lambda: compiled(*args))
        if name.startswith("kiln max"):
            made = decisions_since(seen)
            row["kernels_tuned"] = len(made)
            row["templates_won"] = sum(1 for m in made if m["winner"].startswith("template"))
            row["aten_won"] = sum(1 for m in made if m["winner"] == "aten")
        else:
            decisions_since(seen)
    except Exception as e:  # noqa: BLE001 - the table shows it
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="run the workloads whose name contains this")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--no-torch", action="store_true", help="skip torch.compile (the slowest to autotune)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("autotune_gpu.py needs a CUDA device")
        return 1
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    variants = [
        ("kiln default", lambda fn: kiln.compile(fn)),
        ("kiln max-autotune-no-cudagraphs", lambda fn: kiln.compile(fn, mode="max-autotune-no-cudagraphs")),
    ]
    if not a.no_torch:
        variants.append(("torch max-autotune-no-cudagraphs",
                         lambda fn: torch.compile(fn, mode="max-autotune-no-cudagraphs")))
    print(f"device: {torch.cuda.get_device_name()}  dtype: {a.dtype}  torch {torch.__version__}  "
          f"kiln cache: {os.environ['KILN_CACHE_DIR']}")
    seen: set = set()
    results = []
    for title, fn, make_args in cases(dtype):
        if a.only and a.only not in title:
            continue
        args = make_args()
        with torch.no_grad():
            ref = fn(*args)
            eager_ms = cuda_time(functools.partial(fn, *args))
        rows = []
        for name, make in variants:
            kiln.reset()
            torch._dynamo.reset()  # the reference's own cache, so each variant compiles fresh
            rows.append(run_variant(name, make, fn, args, ref, dtype, seen))
        results.append({"workload": title, "eager_ms": eager_ms, "variants": rows})
        torch_ms = next((x.get("ms") for x in rows if x["variant"].startswith("torch")), None)
        print(f"\n{title}: eager {eager_ms:.4f} ms")
        for x in rows:
            if "error" in x:
                print(f"  {x['variant']:<34} FAILED {x['error']}")
                continue
            vs_torch = f"{torch_ms / x['ms']:.2f}x" if torch_ms else "-"
            extra = ""
            if "kernels_tuned" in x:
                extra = f"  tuned {x['kernels_tuned']} kernels (template {x['templates_won']}, aten {x['aten_won']})"
            print(f"  {x['variant']:<34} {x['ms']:.4f} ms  vs eager {eager_ms / x['ms']:.2f}x  vs torch {vs_torch}  "
                  f"err {x['rel_error']:.1e}{'' if x['ok'] else ' WRONG'}  first call {x['first_call_s']:.1f} s{extra}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "dtype": a.dtype,
                                            "torch": torch.__version__, "results": results}, indent=1))
        print(f"\nwrote {a.json}")
    bad = [(w["workload"], x["variant"]) for w in results for x in w["variants"]
           if x["variant"].startswith("kiln") and ("error" in x or not x.get("ok"))]
    if bad:
        print("\nkiln failures:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

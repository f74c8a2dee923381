"""Does a matmul operand with an unaligned inner size need padding, or only an aligned row stride?

GPT-2's LM head has a vocabulary of 50257 (odd): its logits gradient dL [tokens, 50257] is the K
operand of dX = dL @ W and the (transposed) M operand of dW = dL^T @ X. cuBLAS picks slow
"align1" kernels for unaligned leading dimensions. This times, on the GPU, each matmul with dL stored
  contiguous      row stride 50257 (what eager allocates)
  padded copy     F.pad to 50264 columns before the matmul (shape padding, the copy included)
  padded stride   row stride 50304, the logical size still 50257 (a view into a wider buffer)

    PYTHONPATH=. python benchmarks/padded_strides.py [--tokens 8192] [--vocab 50257] [--hidden 768]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from common import cuda_time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dt = torch.bfloat16
    t, v, h = a.tokens, a.vocab, a.hidden
    wide = -(-v // 64) * 64
    dl = torch.randn(t, v, device="cuda", dtype=dt)
    dl_strided = torch.empty(t, wide, device="cuda", dtype=dt)[:, :v]
    dl_strided.copy_(dl)
    w = torch.randn(v, h, device="cuda", dtype=dt)
    x = torch.randn(t, h, device="cuda", dtype=dt)
    pad = -v % 8
    cases = {
        "dX contiguous": lambda: dl @ w,
        "dX padded copy": lambda: F.pad(dl, (0, pad)) @ F.pad(w, (0, 0, 0, pad)),
        "dX padded stride": lambda: dl_strided @ w,
        "dW contiguous": lambda: dl.t() @ x,
        "dW padded stride": lambda: dl_strided.t() @ x,
    }
    ref_dx, ref_dw = (dl.float() @ w.float()), (dl.float().t() @ x.float())
    rows = {}
    for name, fn in cases.items():
        out = fn().float()
        ref = ref_dx if name.startswith("dX") else ref_dw
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        rows[name] = {"ms": cuda_time(fn, warmup=3, iters=20), "max_rel_err": err}
        print(f"{name:<18} {rows[name]['ms']:7.3f} ms   max rel err {err:.2e}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": t, "vocab": v,
                       "hidden": h, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

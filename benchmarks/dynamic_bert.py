"""BERT inference over many sequence lengths: total time (compile + run) and compile count.

NLP serving sees a new length on nearly every batch; a compiler that recompiles
per length loses. This runs a randomly initialised BERT-base-sized encoder over
sequence lengths 32, 64, ..., 512 (each twice) with eager PyTorch, kiln
(dynamic=None: specialize, then automatic dynamic) and torch.compile (its
default, also automatic dynamic), and reports total wall time and how many
graphs each compiled.

    python benchmarks/dynamic_bert.py [--device cuda] [--layers 12] [--out results.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)


def build(layers: int, device: str):
    from transformers import BertConfig, BertModel

    config = BertConfig(num_hidden_layers=layers, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                        vocab_size=30522, max_position_embeddings=512)
    return BertModel(config).eval().to(device)


def run(model, lengths, batch: int, device: str) -> tuple[float, list]:
    gen = torch.Generator().manual_seed(0)
    outputs = []
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        for n in lengths:
            ids = torch.randint(0, 30522, (batch, n), generator=gen).to(device)
            mask = torch.ones(batch, n, dtype=torch.long, device=device)
            outputs.append(model(input_ids=ids, attention_mask=mask).last_hidden_state.float().cpu())
    sync()
    return time.perf_counter() - start, outputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    lengths = [n for n in range(32, 513, 32) for _ in range(2)]
    torch.manual_seed(0)
    model = build(options.layers, options.device)

    import kiln
    from kiln.api import context_of

    rows = {}
    eager_s, reference = run(model, lengths, options.batch, options.device)
    rows["eager"] = {"total_s": eager_s, "graphs": 0}
    for name, make in (("kiln", lambda m: kiln.compile(m)), ("torch.compile", lambda m: torch.compile(m))):
        torch._dynamo.reset()
        compiled = make(model)
        total, outs = run(compiled, lengths, options.batch, options.device)
        err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(outs, reference))
        if name == "kiln":
            graphs = len(context_of(compiled).records)
        else:
            from torch._dynamo.utils import counters

            graphs = counters["stats"]["unique_graphs"]
        rows[name] = {"total_s": total, "graphs": graphs, "max_rel_err": err}
    print(f"BERT ({options.layers} layers) inference, batch {options.batch}, {len(lengths)} calls over lengths 32..512 "
          f"on {options.device}")
    for name, r in rows.items():
        print(f"  {name:<14} total {r['total_s']:8.2f} s   graphs {r['graphs']}   "
              f"max rel err {r.get('max_rel_err', 0):.2e}")
    if options.out:
        with open(options.out, "w") as f:
            json.dump({"date": datetime.date.today().isoformat(), "device": options.device,
                       "gpu": torch.cuda.get_device_name() if options.device == "cuda" else None,
                       "torch": torch.__version__, "lengths": lengths, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

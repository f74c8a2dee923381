"""Host time of each line of kiln's generated wrappers, each line run alone many times.

wrapper_lines.py traces a real step (sys.settrace), which charges every Python call a line
makes with the tracer's own cost. This script runs no tracer: after warm-up it records the
arguments of one call of each wrapper, replays the wrapper's body once line by line (so every
name a line reads exists), then times each line alone, `--repeat` times back to back, and
synchronizes between lines. Lines that drop buffers (`del`) and the `return` are not timed. A
line's time is the host cost of issuing it (kernel launch, ATen call, allocation), not the
GPU's time, as long as the GPU keeps up (each line's repeats are few and small).

    python benchmarks/wrapper_line_costs.py --bench .bench/models_bench.py --model cnn_fashion_train
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.gpu_profile import KILN_VARIANTS, load_bench
from benchmarks.host_profile import _build

SYNC = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def line_costs(call, source: str, args: tuple, repeat: int) -> list[dict]:
    """(line, microseconds per run) for each statement of the wrapper function `call` (`source`: the wrapper's)."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def call("))
    body = [line.strip() for line in lines[start + 1:] if line.strip()]
    names = call.__code__.co_varnames[:call.__code__.co_argcount]
    env = dict(call.__globals__)
    env.update(zip(names, args))
    rows = []
    with torch.no_grad():
        for line in body:
            if line.startswith(("del ", "return")):
                continue
            code = compile(line.split("; del ")[0], "<line>", "exec")
            exec(code, env)
            SYNC()
            start = time.perf_counter()
            for _ in range(repeat):
                exec(code, env)
            elapsed = time.perf_counter() - start
            SYNC()
            rows.append({"us": round(elapsed / repeat * 1e6, 2), "code": line[:140]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True)
    p.add_argument("--model", default="cnn_fashion_train")
    p.add_argument("--compiler", default="kiln")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--device", default="cuda", help="cuda, or cpu to try the script without a GPU")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from kiln.codegen import GRAPH_LISTENERS

    graphs = []
    GRAPH_LISTENERS.append(lambda graph, options: graphs.append(graph))
    bench = load_bench(args.bench)
    step = _build(bench, args.model, *KILN_VARIANTS.get(args.compiler, (args.compiler, {})), torch.device(args.device))
    for _ in range(15):
        step()
    recorded = {}
    for graph in graphs:
        inner = graph.call

        def record(*a, _g=graph, _inner=inner):
            recorded.setdefault(_g.artefacts.get("name"), (_inner, _g.artefacts["wrapper.py"], tuple(a)))
            return _inner(*a)
        graph.call = record
    step()
    SYNC()
    result = {}
    for name, (call, source, call_args) in recorded.items():
        rows = line_costs(call, source, call_args, args.repeat)
        result[name] = rows
        print(f"== {name}: {sum(r['us'] for r in rows):.1f} us over {len(rows)} lines")
        for r in rows:
            print(f"  {r['us']:8.2f} us  {r['code']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

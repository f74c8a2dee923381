"""Host time per line of kiln's generated wrappers, for one model of the shared benchmark.

step_parts.py says how long a wrapper takes; this says which of its lines: after warm-up it
traces the lines of every `<kiln wrapper ...>` code object (sys.settrace, only those frames)
and charges the time from one line event to the next to the earlier line. Tracing adds about
a microsecond a line, so read the lines that cost tens of microseconds: extern calls,
launches, allocations. The GPU is synchronized before each traced step, so nothing waits on it.

With `--isolated` no tracer runs: the arguments of one call of each wrapper are recorded, the
wrapper's body is replayed once line by line (so every name a line reads exists), then each
line is timed alone, `--repeat` times back to back, with a synchronize between lines (`del`
lines and the `return` are not timed). That is each line's cost with warm caches: in a real
step the same lines cost 2 to 3 times more on the H100 host (2026-11-25: the CNN's forward
wrapper took 154 us line by line, 416 us inside a step).

    python benchmarks/wrapper_lines.py --bench .bench/models_bench.py --model cnn_fashion_train --out lines.json
    python benchmarks/wrapper_lines.py --bench .bench/models_bench.py --model cnn_fashion_train --isolated
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import torch

from common import build_step, harness_compiler, load_bench, write_json


class LineClock:
    """Per (wrapper, line): total seconds and hits, over the traced calls."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.hits = defaultdict(int)
        self.sources: dict[str, list[str]] = {}

    def tracer(self, frame, event, arg):
        name = frame.f_code.co_filename
        if not name.startswith("<kiln wrapper"):
            return None
        last = [None, 0.0]

        def local(frame, event, arg):
            now = time.perf_counter()
            if last[0] is not None:
                self.seconds[(name, last[0])] += now - last[1]
                self.hits[(name, last[0])] += 1
            last[0] = frame.f_lineno if event == "line" else None
            last[1] = time.perf_counter()
            return local
        return local

    def report(self, graphs, steps: int, top: int) -> list[dict]:
        text = {f"<kiln wrapper {g.artefacts.get('name')}>": g.artefacts.get("wrapper.py", "").splitlines()
                for g in graphs}
        rows = []
        for (name, line), s in sorted(self.seconds.items(), key=lambda kv: -kv[1])[:top]:
            lines = text.get(name, [])
            rows.append({"wrapper": name, "line": line, "us_per_step": round(s / steps * 1e6, 1),
                         "code": lines[line - 1].strip()[:140] if 0 < line <= len(lines) else "?"})
        return rows


def isolated_line_costs(call, source: str, args: list, repeat: int, sync) -> list[dict]:
    """(microseconds per run, code) for each statement of the wrapper function `call` (`source`: the
    wrapper's), each run `repeat` times alone on the arguments `args` of a real call (the wrapper takes them
    as one list, `args`, which its first lines unpack and empty)."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def call("))
    body = [line.strip() for line in lines[start + 1:] if line.strip()]
    env = dict(call.__globals__)
    env["args"] = list(args)
    rows = []
    with torch.no_grad():
        for line in body:
            if line.startswith(("del ", "return")):
                continue
            code = compile(line.split("; del ")[0], "<line>", "exec")
            exec(code, env)
            sync()
            t0 = time.perf_counter()
            for _ in range(repeat):
                exec(code, env)
            elapsed = time.perf_counter() - t0
            sync()
            rows.append({"us": round(elapsed / repeat * 1e6, 2), "code": line[:140]})
    return rows


def record_calls(graphs) -> dict:
    """Wrap each compiled graph's call so that its first call's arguments are kept: name -> (call, source, args)."""
    recorded = {}
    for graph in graphs:
        inner = graph.call

        def record(args, _graph=graph, _inner=inner):  # one list, which the wrapper empties: kept as a copy
            recorded.setdefault(_graph.artefacts.get("name"), (_inner, _graph.artefacts["wrapper.py"], list(args)))
            return _inner(args)
        graph.call = record
    return recorded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True)
    p.add_argument("--model", default="cnn_fashion_train")
    p.add_argument("--compiler", default="kiln", help="kiln or kiln-ro")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--device", default="cuda")
    p.add_argument("--isolated", action="store_true", help="time each line alone (see the module docstring)")
    p.add_argument("--repeat", type=int, default=50, help="with --isolated: runs of each line")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from kiln.pipeline import GRAPH_LISTENERS

    graphs = []
    GRAPH_LISTENERS.append(lambda graph, options: graphs.append(graph))
    bench = load_bench(args.bench)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step = build_step(bench, args.model, *harness_compiler(args.compiler), device)
    for _ in range(15):
        step()
    if args.isolated:
        recorded = record_calls(graphs)
        step()
        sync()
        result = {name: isolated_line_costs(call, source, call_args, args.repeat, sync)
                  for name, (call, source, call_args) in recorded.items()}
        for name, rows in result.items():
            print(f"== {name}: {sum(r['us'] for r in rows):.1f} us over {len(rows)} lines")
            for r in rows:
                print(f"  {r['us']:8.2f} us  {r['code']}")
        write_json(args.out, result)
        return
    clock = LineClock()
    for _ in range(args.steps):
        sync()
        sys.settrace(clock.tracer)
        try:
            step()
        finally:
            sys.settrace(None)
    sync()
    rows = clock.report(graphs, args.steps, args.top)
    for r in rows:
        print(f"{r['us_per_step']:8.1f} us  {r['wrapper']}:{r['line']:<4} {r['code']}")
    write_json(args.out, rows)


if __name__ == "__main__":
    main()

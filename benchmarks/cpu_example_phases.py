"""The bundled example (kiln/examples/vit_train.py) on the CPU: eager and kiln steps interleaved, by phase.

`python -m kiln run` times six steps of each, one after the other, which on a shared machine mostly measures
the machine. This builds both models in one process, warms them up, then alternates their steps and reports
the median host milliseconds of each phase (forward with the loss, backward, optimizer) and kiln's two
generated wrappers.

    python benchmarks/cpu_example_phases.py [--steps 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
import kiln
from kiln.examples.vit_train import TinyViT
from kiln.pipeline import GRAPH_LISTENERS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    graphs = []
    GRAPH_LISTENERS.append(lambda graph, options: graphs.append(graph))
    gen = torch.Generator().manual_seed(0)
    images, labels = torch.randn(32, 3, 32, 32, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    runs = {}
    for kind in ("eager", "kiln"):
        torch.manual_seed(0)
        model = TinyViT()
        runs[kind] = (kiln.compile(model) if kind == "kiln" else model, torch.optim.SGD(model.parameters(), lr=0.01))
    phases = {kind: {"forward": [], "backward": [], "optimizer": []} for kind in runs}
    wrappers: dict[str, list] = {}
    for step in range(args.steps + 3):
        if step == 3:  # compiled and warm: time kiln's wrappers from here on
            for graph in graphs:
                graph.call = _timed(graph.call, wrappers.setdefault(graph.artefacts["name"], []))
        for kind, (fn, opt) in runs.items():
            t0 = time.perf_counter()
            loss = F.cross_entropy(fn(images), labels)
            t1 = time.perf_counter()
            opt.zero_grad()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            if step >= 3:
                for name, seconds in zip(phases[kind], (t1 - t0, t2 - t1, t3 - t2)):
                    phases[kind][name].append(seconds)
    ms = lambda v: statistics.median(v) * 1e3  # noqa: E731
    for kind, times in phases.items():
        parts = ", ".join(f"{name} {ms(v):.2f}" for name, v in times.items())
        print(f"{kind:6s} {sum(ms(v) for v in times.values()):7.2f} ms  ({parts})")
    print("kiln's wrappers: " + ", ".join(f"{name} {ms(v):.2f} ms" for name, v in wrappers.items()))


def _timed(call, samples: list):
    def timed(*args):
        start = time.perf_counter()
        try:
            return call(*args)
        finally:
            samples.append(time.perf_counter() - start)
    return timed


if __name__ == "__main__":
    main()

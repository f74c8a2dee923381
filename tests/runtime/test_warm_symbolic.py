"""Graphs with symbolic sizes come from the compile cache too: a second process over a first's cache traces and
compiles nothing, returns eager's values, and guards exactly as the first process did.

Each case runs its steps compiled and eagerly (the same seed) in a fresh process, twice over one cache directory;
the process prints what it compiled (kiln's counters, as in test_warm_models.py), the largest difference from
eager over the losses and gradients, and the size guards its captures produced (ShapeEnv's guard expressions):
a process that loads a product adds the guards its making added (kiln/runtime/symbolic_sizes.py), so the two
processes' guards must be the same, neither weaker (a wrong answer for a size the product was not made for) nor
stronger (a recompile the first process did not need).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from support.cache import seed_guard_extension

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import kiln
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from kiln.runtime import cache, graph_cache

    GUARDS = []
    _produce = ShapeEnv.produce_guards_expression

    def produce(self, *args, **kwargs):  # every capture's size guards, as its guard function checks them
        GUARDS.append(_produce(self, *args, **kwargs))
        return GUARDS[-1]

    ShapeEnv.produce_guards_expression = produce
    DEVICE = os.environ.get("KILN_TEST_DEVICE", "cpu")
    if DEVICE != "cpu":
        torch.set_default_device(DEVICE)  # models and inputs made on it (the GPU case: Triton products)

    def mlp(width):  # each case its own width: a case must not find another's graphs in the cache
        return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.GELU(), torch.nn.Linear(width, 1))

    def train(fn, params, inputs):
        losses = []
        for x in inputs:
            loss = fn(x).pow(2).mean()
            loss.backward()
            losses.append(loss.detach())
        return losses + [p.grad for p in params]

    def dynamic_batch(compile):  # a new batch size recompiles with a symbolic batch (automatic dynamic)
        net = mlp(16)
        return train(compile(net), net.parameters(), [torch.randn(b, 8) for b in (4, 6, 9)])

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.attn = torch.nn.Embedding(50, 16), torch.nn.MultiheadAttention(16, 2, batch_first=True)
            self.head = torch.nn.Linear(16, 1)

        def forward(self, ids):
            x = self.embed(ids)
            return self.head(self.attn(x, x, x, need_weights=False)[0] + x)

    def dynamic_sequence(compile):  # a sequence length that changes: the second dimension becomes a symbol
        net = Attention()
        return train(compile(net), net.parameters(), [torch.randint(0, 50, (2, n)) for n in (8, 12, 5)])

    def dynamic_from_start(compile):  # dynamic=True: symbolic sizes from the first compile; a split's last
        net = mlp(12)                  # part has a size of its own, whose tensors a trace asks more of

        def fn(x):
            return net(torch.cat([part * k for k, part in enumerate(x.split(3))]))
        inputs = [torch.randn(b, 8, requires_grad=True) for b in (10, 12)]
        return train(compile(fn, dynamic=True), [*net.parameters(), *inputs], inputs)

    def marked_dynamic(compile):  # a dimension marked dynamic before the first call
        net = mlp(20)
        inputs = [torch.randn(b, 8) for b in (5, 10)]
        for x in inputs:
            kiln.mark_dynamic(x, 0)
        return train(compile(net), net.parameters(), inputs)

    def inference(compile):  # an inference graph with a symbolic batch, under no_grad
        net = mlp(24)
        fn = compile(net, dynamic=True)
        with torch.no_grad():
            return [fn(torch.randn(b, 8)) for b in (3, 6)]

    def counts():
        stats = graph_cache.folder_stats
        return {"traces": stats["aot"]["traces"], "compiles": stats["graphs"]["compiles"],
                "uncacheable": stats["graphs"]["uncacheable"] + stats["aot"]["uncacheable"],
                "graph_hits": stats["graphs"]["hits"], "aot_hits": stats["aot"]["hits"],
                "cxx_compiles": cache.stats["compiles"]}

    for case in sys.argv[1:]:  # one JSON line per case
        torch.manual_seed(0)
        expected = globals()[case](lambda f, **options: f)
        before, guards = counts(), len(GUARDS)
        torch.manual_seed(0)
        got = globals()[case](kiln.compile)
        made = {k: v - before[k] for k, v in counts().items()}
        diff = max((g - e).abs().max().item() for g, e in zip(got, expected, strict=True))
        print(json.dumps({**made, "max_diff": diff, "guards": GUARDS[guards:]}))
""")

CASES = ["dynamic_batch", "dynamic_sequence", "dynamic_from_start", "marked_dynamic", "inference"]


def _process(cache_dir: Path, device: str = "cpu") -> dict[str, dict]:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_GRAPH_CACHE="1", OMP_NUM_THREADS="1",
               KILN_TEST_DEVICE=device)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *CASES], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(CASES, map(json.loads, proc.stdout.strip().splitlines()[-len(CASES):])))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict]:
    """Every case in a first process over an empty cache, then in a second over the same cache."""
    root = tmp_path_factory.mktemp("warm_symbolic") / "cache"
    seed_guard_extension(root)
    return _process(root), _process(root)


@pytest.mark.parametrize("case", CASES)
def test_the_first_process_stores_every_symbolic_graph(runs, case):
    cold = runs[0][case]
    assert cold["compiles"] > 0 and cold["uncacheable"] == 0, cold
    assert cold["max_diff"] < 1e-4, cold


@pytest.mark.parametrize("case", CASES)
def test_the_second_process_compiles_nothing_and_returns_eagers_values(runs, case):
    cold, warm = runs[0][case], runs[1][case]
    assert {k: warm[k] for k in ("traces", "compiles", "uncacheable", "cxx_compiles")} == \
        {"traces": 0, "compiles": 0, "uncacheable": 0, "cxx_compiles": 0}, warm
    assert warm["graph_hits"] == cold["compiles"] and warm["aot_hits"] == cold["traces"], (cold, warm)
    assert warm["max_diff"] < 1e-4, warm


@pytest.mark.parametrize("case", CASES)
def test_the_second_process_guards_as_the_first(runs, case):
    cold, warm = runs[0][case], runs[1][case]
    assert any("size()" in g for g in cold["guards"]), cold["guards"]  # the case has symbolic sizes
    assert warm["guards"] == cold["guards"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU")
def test_the_second_process_compiles_nothing_on_the_gpu(tmp_path):
    """The same cases on the GPU: Triton products with symbolic sizes, their launchers and binaries kept."""
    seed_guard_extension(tmp_path / "cache")
    cold, warm = _process(tmp_path / "cache", "cuda"), _process(tmp_path / "cache", "cuda")
    for case in CASES:
        assert cold[case]["uncacheable"] == 0, (case, cold[case])
        assert (warm[case]["traces"], warm[case]["compiles"], warm[case]["uncacheable"]) == (0, 0, 0), (case, warm)
        assert warm[case]["max_diff"] < 1e-3 and warm[case]["guards"] == cold[case]["guards"], (case, warm)

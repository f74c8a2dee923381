"""A second process over the compile cache of a first: what it skips, and what it must not reuse.

The process captures the frame again (capture is what the caches are keyed by: the captured graph), then takes
the AOT graphs (no trace, functionalization or partition), the generated wrappers and the kernels (no g++) from
the cache. Whatever the first process captured differently for (the called function's code, a global it read,
the input shapes) gives another captured graph or other inputs, so a miss, compiled anew and equal to eager."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.cache import seed_guard_extension

# argv: a JSON list of variants, each {"body": "gelu" | "tanh", "scale": the global SCALE, "batch": batch size},
# each compiled by a new kiln.compile in this process; prints one JSON line per variant
SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import kiln
    from kiln.autograd import aot_cache
    from kiln.capture import entry
    from kiln.runtime import cache, graph_cache

    def gelu_helper(x):
        return torch.nn.functional.gelu(x) * SCALE

    def tanh_helper(x):
        return torch.tanh(x) * SCALE

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

        def forward(self, x):
            return helper(self.norm(self.fc(x))) + x

    def counts():
        return {"captures": len(captures), "aot_hits": aot_cache.stats["hits"], "aot_stores": aot_cache.stats["stores"],
                "graph_hits": graph_cache.stats["hits"], "cxx_compiles": cache.stats["compiles"]}

    captures = []
    entry.RECORD_LISTENERS.append(lambda ctx, record: captures.append(record.op_count))
    for variant in json.loads(sys.argv[1]):
        kiln.reset()  # each variant a compile of its own (calls naming one backend share their captures)
        helper = gelu_helper if variant["body"] == "gelu" else tanh_helper
        SCALE = variant["scale"]
        torch.manual_seed(0)
        net = Net()
        x = torch.randn(variant["batch"], 8)
        before = counts()
        results = []
        for model in (net, kiln.compile(net)):
            net.zero_grad()
            out = model(x)
            out.square().sum().backward()
            results.append([out.detach()] + [p.grad.clone() for p in net.parameters()])
        done = {k: v - before[k] for k, v in counts().items()}
        done["equal_to_eager"] = all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(*results))
        print(json.dumps(done))
""")

FIRST = {"body": "gelu", "scale": 2.0, "batch": 4}
CHANGES = {
    "code": dict(FIRST, body="tanh"),  # the called function's code
    "global": dict(FIRST, scale=3.0),  # a global the function read (baked into the captured graph)
    "shape": dict(FIRST, batch=6),  # the input's shape
}


def _process(cache_dir: Path, variants: list[dict]) -> list[dict]:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_GRAPH_CACHE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(variants)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(variants):]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """A first process on an empty cache, then a second over it: the first's variant again, then each change."""
    root = tmp_path_factory.mktemp("warm") / "cache"
    seed_guard_extension(root)
    [first] = _process(root, [FIRST])
    second = _process(root, [FIRST, *CHANGES.values()])
    return {"first": first, "warm": second[0], **dict(zip(CHANGES, second[1:]))}


def test_first_process_compiles_everything(runs):
    assert runs["first"]["equal_to_eager"]
    assert runs["first"]["aot_hits"] == 0 and runs["first"]["aot_stores"] == 1
    assert runs["first"]["graph_hits"] == 0 and runs["first"]["cxx_compiles"] >= 1


def test_second_process_traces_and_builds_nothing(runs):
    assert runs["warm"] == {"captures": 1, "aot_hits": 1, "aot_stores": 0, "graph_hits": 2, "cxx_compiles": 0,
                            "equal_to_eager": True}


@pytest.mark.parametrize("change", CHANGES)
def test_what_the_first_process_captured_for_changed_is_a_miss_and_equals_eager(runs, change):
    assert runs[change]["captures"] == 1 and runs[change]["equal_to_eager"]
    assert runs[change]["aot_hits"] == 0 and runs[change]["aot_stores"] == 1, runs[change]

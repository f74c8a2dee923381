"""A second process over a first's cache compiles nothing: no AOT trace, no ATen graph through the stages, no C++
compiler, for the programs a user trains and serves.

Each case runs in a fresh process twice over one cache directory. The counters are kiln's own: `traces` (AOT
variants traced, kiln/autograd/aot_cache.py), `compiles` (ATen graphs run through the stages) and `uncacheable`
(kiln/runtime/graph_cache.py), `compiles` of the C++ compiler (kiln/runtime/cache.py). A graph whose product the
cache cannot describe is compiled by every process: `uncacheable` says so, which a warm start must not show.

The GPU's part of the same class (a wrapper holding a kiln helper, the shape-padded matmul of a GPT-2 vocabulary)
is in `test_a_padded_matmul_graph_is_cached_for_the_gpu` (fake CUDA tensors, the Triton target).
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

import kiln
from kiln.runtime import graph_cache
from support.cache import seed_guard_extension

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import kiln
    from kiln.runtime import cache, graph_cache

    def gpt2(device="cpu", width=32, vocab=97, seq=16):
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=1, n_embd=width, n_head=2, vocab_size=vocab, n_positions=seq, bos_token_id=0,
                         eos_token_id=0)  # dropout on, a vocabulary of no round size, tied embeddings
        model = GPT2LMHeadModel(cfg).to(device)
        ids = torch.randint(0, vocab, (2, seq), device=device)
        fn = kiln.compile(model)

        def step():
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = fn(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            return loss
        return step

    def gpt2_cuda():  # GPT-2's own width and vocabulary: the LM head's matmuls are shape-padded
        return gpt2("cuda", width=768, vocab=50257, seq=128)

    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.a(x).relu()
            torch._dynamo.graph_break()  # two captured graphs, each with a forward and a backward
            return self.b(y).sum()

    def graph_break():
        fn, x = kiln.compile(Broken()), torch.randn(4, 8)

        def step():
            loss = fn(x)
            loss.backward()
            return loss
        return step

    def static_recompile():
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
        fn = kiln.compile(net, dynamic=False)  # a new batch size recompiles, with static sizes

        def step():
            return sum(fn(torch.randn(batch, 8)).sum() for batch in (4, 6))
        return step

    def automatic_dynamic():  # more symbolic cases: test_warm_symbolic.py
        net = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU())  # not static_recompile's graphs
        fn = kiln.compile(net)  # a new batch size recompiles with a symbolic batch

        def step():
            out = sum(fn(torch.randn(batch, 8)).sum() for batch in (4, 6))
            out.backward()
            return out
        return step

    def counts():
        stats = graph_cache.folder_stats
        return {"traces": stats["aot"]["traces"], "compiles": stats["graphs"]["compiles"],
                "uncacheable": stats["graphs"]["uncacheable"] + stats["aot"]["uncacheable"],
                "graph_hits": stats["graphs"]["hits"], "cxx_compiles": cache.stats["compiles"]}

    for case in sys.argv[1:]:  # one JSON line per case: what it compiled and took from the cache
        torch.manual_seed(0)
        before = counts()
        step = globals()[case]()
        for _ in range(2):  # the second step runs what a first one compiles lazily
            step()
        print(json.dumps({k: v - before[k] for k, v in counts().items()}))
""")


CASES = {"gpt2": 2, "graph_break": 4, "static_recompile": 4, "automatic_dynamic": 4}  # case -> its ATen graphs


def _process(cache_dir: Path, cases: list[str]) -> dict[str, dict]:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), KILN_GRAPH_CACHE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *cases], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(cases, map(json.loads, proc.stdout.strip().splitlines()[-len(cases):])))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict]:
    """Every case in a first process over an empty cache, then in a second over the same cache."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("warm_models") / "cache"
    seed_guard_extension(root)
    return _process(root, list(CASES)), _process(root, list(CASES))


NOTHING_COMPILED = {"traces": 0, "compiles": 0, "uncacheable": 0, "cxx_compiles": 0}


@pytest.mark.parametrize("case", CASES)
def test_the_second_process_compiles_nothing(runs, case):
    cold, warm = runs[0][case], runs[1][case]
    assert cold["compiles"] == CASES[case] and cold["uncacheable"] == 0, cold
    assert {k: warm[k] for k in NOTHING_COMPILED} == NOTHING_COMPILED, warm
    assert warm["graph_hits"] == CASES[case]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU")
def test_the_second_process_compiles_nothing_on_the_gpu(tmp_path):
    """GPT-2 training on the GPU at its own width and vocabulary (Triton kernels, shape-padded LM head)."""
    pytest.importorskip("transformers")
    seed_guard_extension(tmp_path / "cache")
    cold, warm = _process(tmp_path / "cache", ["gpt2_cuda"]), _process(tmp_path / "cache", ["gpt2_cuda"])
    assert cold["gpt2_cuda"]["compiles"] == 2 and cold["gpt2_cuda"]["uncacheable"] == 0, cold
    assert {k: warm["gpt2_cuda"][k] for k in NOTHING_COMPILED} == NOTHING_COMPILED, warm


def test_a_padded_matmul_graph_is_cached_for_the_gpu(fresh_cache, monkeypatch):
    """A CUDA matmul whose inner size is not a multiple of 8 (GPT-2's 50257-word vocabulary) calls the shape-padded
    matmul, a kiln helper in the wrapper's namespace: its product describes it, and a second compile of the graph
    (kiln's memory of loaded modules cleared, as in a new process) takes it from the cache and calls the same."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.codegen import triton as triton_codegen
    from kiln.codegen.triton.templates import PaddedMatmul
    from kiln.pipeline import compile_aten_graph
    from support.fake_cuda import on_device

    cpu_inputs = [torch.randn(1024, 1001, dtype=torch.bfloat16), torch.randn(1001, 1024, dtype=torch.bfloat16)]
    gm, inputs = on_device(make_fx(lambda x, w: (x @ w).relu())(*cpu_inputs), cpu_inputs, "cuda")
    stores, hits = graph_cache.stats["stores"], graph_cache.stats["hits"]
    first = compile_aten_graph(gm, inputs)
    assert graph_cache.stats["stores"] == stores + 1 and not first.artefacts.get("from_cache")
    [product] = [json.loads(p.read_text()) for p in (fresh_cache / "graphs").rglob("*.json")
                 if not p.name.endswith(".manifest.json")]
    assert {"kiln": "PaddedMatmul", "fields": {"op": "mm", "multiple": 8}} in product["namespace"].values()

    monkeypatch.setattr(triton_codegen, "_loaded", {})
    kiln.reset()
    decoded, decode = [], graph_cache.decode_product
    monkeypatch.setattr(graph_cache, "decode_product", lambda *args: decoded.append(decode(*args)) or decoded[-1])
    second = compile_aten_graph(gm, inputs)
    assert second.artefacts.get("from_cache") and graph_cache.stats["hits"] == hits + 1
    [(_, namespace)] = decoded
    padded = [v for v in namespace.values() if isinstance(v, PaddedMatmul)]
    assert [(p.op, p.multiple) for p in padded] == [("mm", 8)]


def test_a_helper_the_product_names_but_this_kiln_lacks_is_refused():
    """A product is plain data: a helper is rebuilt only from kiln's registered classes, never imported by name."""
    with pytest.raises(ValueError, match="helper"):
        graph_cache.decode_value({"kiln": "os.system", "fields": {}})
    from kiln.codegen.triton.templates import PaddedMatmul

    rebuilt = graph_cache.decode_value(graph_cache.encode_value(PaddedMatmul("bmm", 4)))
    assert type(rebuilt) is PaddedMatmul and rebuilt.fields() == {"op": "bmm", "multiple": 4}

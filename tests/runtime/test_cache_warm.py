"""Warm start: each compiled ATen graph's product (kernel source, wrapper source, signatures, namespace) is
kept in the cache by a key over the graph, its inputs, options and versions; a later compile of the same graph
(another process, or this one after kiln.reset()) skips every stage but build, and computes what eager does.
kiln.save_cache_artifacts() / load_cache_artifacts() carry the cache to a fresh one, checked before written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.autograd import aot_cache
from kiln.runtime import cache, graph_cache
from kiln.runtime.private_files import PrivateTree
from support import triton_device
from support.cache import fake_compiler, seed_guard_extension


def _mlp(x, w, b):
    return torch.nn.functional.gelu(x @ w + b).softmax(-1) * 3


def _with_constant(x):
    return x * torch.tensor([1.5, -2.0, 0.25]) + x.sum()


def _floor_divide(a, b):
    return (a // b) + 1


CASES = {
    "inference": (_mlp, lambda: (torch.randn(4, 8), torch.randn(8, 8), torch.randn(8))),
    "training": (_mlp, lambda: (torch.randn(4, 8), torch.randn(8, 8, requires_grad=True),
                                torch.randn(8, requires_grad=True))),
    "tensor_constant": (_with_constant, lambda: (torch.randn(5, 3),)),
    "integer_division": (_floor_divide, lambda: (torch.arange(1, 13).reshape(3, 4), torch.full((3, 4), 3))),
}


def _run(fn, args):
    """The outputs and the gradients of the inputs that require grad."""
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*args)
    grads = []
    if any(a.requires_grad for a in args):
        out.sum().backward()
        grads = [a.grad for a in args if a.requires_grad]
    return out.detach(), grads


def _compile_twice(fn, args):
    first = _run(kiln.compile(fn), args)
    kiln.reset()
    hits = graph_cache.stats["hits"]
    second = _run(kiln.compile(fn), args)
    return first, second, graph_cache.stats["hits"] - hits


@pytest.mark.parametrize("case", list(CASES))
def test_second_compile_comes_from_the_cache_and_matches_eager(fresh_cache, compiled_graphs, case):
    fn, make = CASES[case]
    args = make()
    first, second, hits = _compile_twice(fn, args)
    expected = _run(fn, args)
    for got in (first, second):
        torch.testing.assert_close(got, expected)
    cached = [g for g in compiled_graphs if g.artefacts.get("from_cache")]
    assert hits == len(cached) == len(compiled_graphs) // 2 >= 1
    assert all(set(g.artefacts["times"]) == {"build"} for g in cached), "no stage but build ran"


def test_cached_graph_still_raises_what_eager_raises(fresh_cache):
    a, b = torch.arange(1, 13).reshape(3, 4), torch.full((3, 4), 3)
    kiln.compile(_floor_divide)(a, b)
    kiln.reset()
    hits = graph_cache.stats["hits"]
    warm = kiln.compile(_floor_divide)
    torch.testing.assert_close(warm(a, b), _floor_divide(a, b))
    assert graph_cache.stats["hits"] == hits + 1
    with pytest.raises(RuntimeError) as eager:
        _floor_divide(a, torch.zeros_like(b))
    with pytest.raises(type(eager.value), match=str(eager.value)):  # the kernel's check came back with it
        warm(a, torch.zeros_like(b))


@pytest.mark.parametrize("change", ["shape", "dtype", "option", "requires_grad"])
def test_a_different_graph_input_or_option_is_a_miss(fresh_cache, change):
    x, w, b = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    kiln.compile(_mlp)(x, w, b)
    kiln.reset()
    hits = graph_cache.stats["hits"]
    options = None
    if change == "shape":
        x = torch.randn(6, 8)
    elif change == "dtype":
        x, w, b = x.double(), w.double(), b.double()
    elif change == "option":
        options = {"epilogue_fusion": False, "shape_padding": False}
    else:
        w.requires_grad_(True)
    out = kiln.compile(_mlp, options=options)(x, w, b)
    torch.testing.assert_close(out, _mlp(x, w, b))
    assert graph_cache.stats["hits"] == hits


def test_a_tampered_product_is_not_run_but_compiled_again(fresh_cache, caplog):
    x, w, b = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    kiln.compile(_mlp)(x, w, b)
    for path in (fresh_cache / "graphs").rglob("*.json"):
        if not path.name.endswith(".manifest.json"):
            product = json.loads(path.read_text())
            product["wrapper"] = product["wrapper"].replace("return (", "return (0 * ", 1)  # a wrong answer
            path.write_text(json.dumps(product))
    kiln.reset()
    hits = graph_cache.stats["hits"]
    torch.testing.assert_close(kiln.compile(_mlp)(x, w, b), _mlp(x, w, b))
    assert graph_cache.stats["hits"] == hits
    assert any("rebuilding" in r.getMessage() and "graphs" in r.getMessage() for r in caplog.records)


def test_a_graph_with_symbolic_sizes_is_cached(fresh_cache):
    """dynamic=True: the graph's product is kept, and a second compile (as in a new process) takes it for another
    batch size (more cases, in separate processes: tests/runtime/test_warm_symbolic.py)."""
    w, b = torch.randn(8, 8), torch.randn(8)
    stats = dict(graph_cache.stats)
    x = torch.randn(4, 8)
    torch.testing.assert_close(kiln.compile(_mlp, dynamic=True)(x, w, b), _mlp(x, w, b))
    assert graph_cache.stats["stores"] == stats["stores"] + 1
    assert graph_cache.stats["uncacheable"] == stats["uncacheable"]
    kiln.reset()
    x = torch.randn(7, 8)
    torch.testing.assert_close(kiln.compile(_mlp, dynamic=True)(x, w, b), _mlp(x, w, b))
    assert graph_cache.stats["hits"] == stats["hits"] + 1 and graph_cache.stats["compiles"] == stats["compiles"] + 1


def _to_fresh_cache(monkeypatch, root):
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.setattr(cache, "_tree", PrivateTree("cache"))


def test_artifacts_saved_here_start_a_fresh_cache_warm(fresh_cache, tmp_path, monkeypatch):
    fn, make = CASES["training"]
    args = make()
    _run(kiln.compile(fn), args)
    blob = kiln.save_cache_artifacts()
    _to_fresh_cache(monkeypatch, tmp_path / "elsewhere")
    written = kiln.load_cache_artifacts(blob)
    assert written["graphs"] == 2 and written["cpp"] >= 2
    kiln.reset()
    hits = graph_cache.stats["hits"]
    torch.testing.assert_close(_run(kiln.compile(fn), args), _run(fn, args))
    assert graph_cache.stats["hits"] - hits == 2


@pytest.mark.parametrize("damage", ["flipped_byte", "truncated", "path_outside", "not_a_blob"])
def test_a_damaged_blob_is_refused_whole(fresh_cache, tmp_path, monkeypatch, damage):
    kiln.compile(_mlp)(torch.randn(4, 8), torch.randn(8, 8), torch.randn(8))
    blob = bytearray(kiln.save_cache_artifacts())
    if damage == "flipped_byte":
        blob[-10] ^= 1
    elif damage == "truncated":
        blob = blob[:-100]
    elif damage == "path_outside":
        blob = bytes(blob).replace(b'"path": "graphs/', b'"path": "../../x/', 1)
    else:
        blob = b"PK\x03\x04" + bytes(blob)
    target = tmp_path / "elsewhere"
    _to_fresh_cache(monkeypatch, target)
    with pytest.raises(ValueError, match="kiln.load_cache_artifacts"):
        kiln.load_cache_artifacts(bytes(blob))
    assert not target.exists() or [p for p in target.rglob("*") if p.is_file()] == []


DEPLOY = textwrap.dedent("""
    import sys, torch, kiln
    from kiln.autograd import aot, aot_cache
    from kiln.runtime import cache, graph_cache
    traced = []
    for name in ("trace_joint", "trace_forward"):  # counted: a warm process traces nothing
        original = getattr(aot, name)
        setattr(aot, name, lambda *a, _f=original, **k: traced.append(_f.__name__) or _f(*a, **k))
    def model(x, w):
        return torch.relu(x @ w).softmax(-1).sum(0)
    x, w = torch.randn(16, 32), torch.randn(32, 32, requires_grad=True)
    if sys.argv[1] == "load":
        kiln.load_cache_artifacts(open(sys.argv[2], "rb").read())
    out = kiln.compile(model)(x, w)
    out.sum().backward()
    ref_w = w.detach().clone().requires_grad_(True)
    model(x, ref_w).sum().backward()
    torch.testing.assert_close(w.grad, ref_w.grad)
    if sys.argv[1] == "save":
        open(sys.argv[2], "wb").write(kiln.save_cache_artifacts())
    print("hits", graph_cache.stats["hits"], "aot", aot_cache.stats["hits"], "traced", len(traced),
          "compiles", cache.stats["compiles"])
""")


def test_a_server_starts_warm_from_a_blob_built_elsewhere_without_a_compiler(tmp_path):
    """The deployment path: process 1 compiles and saves; process 2, with an empty cache and a compiler that
    fails if called, loads the blob and runs strict (no fallback) with every graph from the cache: it traces no
    AOT graph (the joint graph's forward and backward come from the cache too) and builds no kernel."""
    blob = tmp_path / "artifacts.bin"
    seed_guard_extension(tmp_path / "build")  # the build machine ran kiln before: the blob carries the extension
    env = dict(os.environ, KILN_STRICT="1", OMP_NUM_THREADS="1", KILN_CACHE_DIR=str(tmp_path / "build"),
               KILN_CXX="g++")
    first = subprocess.run([sys.executable, "-c", DEPLOY, "save", str(blob)], env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    broken = fake_compiler(tmp_path / "bin", "exit 1").rename(tmp_path / "bin" / "g++")  # the same command name
    env.update(KILN_CACHE_DIR=str(tmp_path / "server"), PATH=f"{broken.parent}{os.pathsep}{env['PATH']}")
    second = subprocess.run([sys.executable, "-c", DEPLOY, "load", str(blob)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert first.stdout.split()[2:6] == ["aot", "0", "traced", "1"]
    assert second.stdout.split() == ["hits", "2", "aot", "1", "traced", "0", "compiles", "0"]


def _zero_dim_constant(x):
    return x * torch.tensor(2.5) + torch.tensor(True)


def test_zero_dim_and_bool_constants_round_trip(fresh_cache):
    x = torch.randn(4)
    first, second, hits = _compile_twice(_zero_dim_constant, (x,))
    torch.testing.assert_close(second, _run(_zero_dim_constant, (x,)))
    assert hits >= 1


def test_the_guards_extension_travels_with_the_artifacts(fresh_cache, tmp_path, monkeypatch):
    """A cached build of the guards' C++ extension that this process loaded goes into the blob, and a fresh cache
    gets it at the extension's own path (a server then loads it instead of building it while its first calls run).
    A placeholder file stands in for the library: building the real one takes a minute."""
    from kiln.capture import tensor_checks
    from kiln.runtime.private_files import publish, temp_name

    library = tensor_checks._library_path()
    built = temp_name(library)
    built.write_bytes(b"\x7fELF a library")
    publish(built, library)
    cache.record_use(library)
    blob = kiln.save_cache_artifacts()
    _to_fresh_cache(monkeypatch, tmp_path / "elsewhere")
    assert kiln.load_cache_artifacts(blob).get("ext") == 1
    assert tensor_checks._library_path().read_bytes() == b"\x7fELF a library"


TRITON_ON_CPU = pytest.mark.skipif(triton_device.DEVICE != "cpu" or not triton_device.INTERPRETING,
                                   reason="Triton kernels on CPU tensors need Triton's interpreter")


@TRITON_ON_CPU
@pytest.mark.parametrize("case", ["inference", "training"])
def test_triton_graphs_come_from_the_cache_too(fresh_cache, compiled_graphs, monkeypatch, case):
    """The Triton target's product: kernel module source, wrapper, and each kernel's launchers with the dtypes they
    compile for; the second compile loads the module from the disk cache (not this process's memory), compiles
    the launchers as recorded, and runs no stage but build."""
    from kiln.codegen import triton as triton_codegen

    monkeypatch.setenv("KILN_CPU_BACKEND", "triton")
    fn, make = CASES[case]
    args = make()
    first = _run(kiln.compile(fn), args)
    monkeypatch.setattr(triton_codegen, "_loaded", {})
    kiln.reset()
    hits = graph_cache.stats["hits"]
    second = _run(kiln.compile(fn), args)
    expected = _run(fn, args)
    for got in (first, second):
        torch.testing.assert_close(got, expected)
    cached = [g for g in compiled_graphs if g.artefacts.get("from_cache")]
    assert graph_cache.stats["hits"] - hits == len(cached) == len(compiled_graphs) // 2 >= 1
    assert all("kernels.py" in g.artefacts and set(g.artefacts["times"]) == {"build"} for g in cached)
    products = [json.loads(p.read_text()) for p in (fresh_cache / "graphs").rglob("*.json")
                if not p.name.endswith(".manifest.json")]
    assert all(k["precompiles"] for p in products for k in p["kernels"].values())


@pytest.mark.parametrize("case", ["inference", "training"])
def test_a_warm_compile_starts_no_kernel_builds(fresh_cache, monkeypatch, case):
    """The Triton build workers (256 MB and seconds of imports each) start where kernels will be built: before the
    autograd trace on an AOT cache miss, before lowering on a product miss. A compile whose graphs all come from
    the cache starts none: their imports would only compete with its first steps for the CPU."""
    from kiln import pipeline

    starts = []
    monkeypatch.setattr(pipeline, "_start_gpu_build", lambda device: starts.append(device))
    fn, make = CASES[case]
    args = make()
    _run(kiln.compile(fn), args)
    assert starts, "a cold compile starts its builds"
    kiln.reset()
    starts.clear()
    torch.testing.assert_close(_run(kiln.compile(fn), args), _run(fn, args))
    assert starts == []


def test_a_product_miss_under_a_cached_aot_graph_starts_builds(fresh_cache, monkeypatch):
    """The AOT entry alone (the kernels' products gone) traces nothing but lowers and builds: the builds start
    before the lowering."""
    from kiln import pipeline

    starts = []
    monkeypatch.setattr(pipeline, "_start_gpu_build", lambda device: starts.append(device))
    fn, make = CASES["training"]
    args = make()
    _run(kiln.compile(fn), args)
    kiln.reset()
    for product in (fresh_cache / "graphs").rglob("*.json"):
        product.unlink()
    starts.clear()
    aot_hits = aot_cache.stats["hits"]
    torch.testing.assert_close(_run(kiln.compile(fn), args), _run(fn, args))
    assert aot_cache.stats["hits"] > aot_hits
    assert len(starts) == 2  # the forward's lowering, the backward's

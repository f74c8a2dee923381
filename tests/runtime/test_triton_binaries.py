"""A warm process loads its Triton kernels from kiln's cache, without Triton's JIT (kiln/runtime/triton_binaries.py).

A cold process compiles a kernel through Triton's JIT and, as its graph's product is recorded, keeps the binary and
its metadata in kiln's cache. A warm process hands each launcher that binary directly: no `JITFunction.run`, no
`triton_key()` (Triton's hash of its own installation), the same specialization and fast path as the cold one. A
stored binary that is damaged, missing or made by another Triton is not used: the launcher goes through the JIT
(which finds Triton's own cache entry), and a damaged copy is written again.

No GPU is needed: child processes compile for sm_90 behind a driver that only names the target (as the build
workers do) and load nothing onto a GPU. With KILN_TRITON_TEST_DEVICE=cuda the children use the real driver, and
the warm one also runs the kernel and checks what it computes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.codegen import triton as triton_target  # noqa: E402
from kiln.runtime import triton_binaries  # noqa: E402
from kiln.runtime.private_files import manifest_path, verify  # noqa: E402
from support.triton_sm90 import DOUBLING_KERNEL  # noqa: E402

# The doubling kernel, and a second launcher of it as kernels equal up to names get (shared_kernels.py).
KERNELS = triton_target.HEADER + DOUBLING_KERNEL + \
    "_launch_triton_twice = Launcher(triton_double, 2, num_warps=4, XBLOCK=1024)\n"
ON_GPU = os.environ.get("KILN_TRITON_TEST_DEVICE") == "cuda"
DEVICE = "cuda" if ON_GPU else "cpu"

# One process of a GPU host. "cold": the kernel's two specializations loaded through a cached product's precompiles
# and Triton's JIT, then the product recorded (the binaries kept in kiln's cache) and the artifacts saved. "warm":
# the product read back, its kernel loaded again, every call into Triton's JIT and triton_key counted; on a GPU the
# kernel then runs. "server": a warm process that first loads the artifacts into its empty caches.
CHILD = textwrap.dedent('''
    import hashlib, json, sys, types
    import torch, triton
    import triton.runtime.cache as triton_runtime_cache
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction
    import kiln
    from kiln.codegen.triton import build_worker_process, launch, load_module, precompile_all
    from kiln.runtime import graph_cache, triton_binaries

    mode, device, product_file, blob, version = sys.argv[1:6]
    if device == "cpu":  # compile for sm_90 without a GPU; nothing is loaded onto one
        triton.runtime.driver.set_active(build_worker_process.TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
        launch._direct_launch = lambda binary: (None, ())
    if version:  # a process running another Triton than the one that compiled the binaries
        triton.__version__ = version
    if mode == "server":  # a warm process from empty caches and the cold process's artifacts
        kiln.load_cache_artifacts(open(blob, "rb").read())
        mode = "warm"
    jit = []

    def counted(name, original):
        def call(*args, **kwargs):
            jit.append(name)
            return original(*args, **kwargs)
        return call

    JITFunction.run = counted("JITFunction.run", JITFunction.run)
    triton_runtime_cache.triton_key = counted("triton_key", triton_runtime_cache.triton_key)
    module = load_module(sys.stdin.read())
    # a launcher takes one dtype signature (its kernel's); the shared kernel's second launcher takes two here, so
    # that its float32 specialization is the binary the first launcher loaded too
    precompiles = [["_launch_triton_double", ["float32", "float32"], [4096]]]
    precompiles += [["_launch_triton_twice", [d, d], [4096]] for d in ("bfloat16", "float32")]
    described = {"arg_names": ["in_ptr0", "out_ptr0"], "size_args": [], "reports_errors": False,
                 "precompiles": precompiles}
    if mode == "warm":
        described = json.load(open(product_file))["kernels"]["triton_double"]
    kernel = graph_cache.KernelSignature(**described)
    precompile_all(module, {"triton_double": kernel}, device)
    launcher = module._launch_triton_double
    out = {"jit": sorted(set(jit)), "stats": triton_binaries.stats, "launches": len(launcher.launches),
           "fast_ints": list(launcher.fast_ints),
           "cubins": sorted(hashlib.sha256(b.kernel).hexdigest() for b in launcher.compiled.values()),
           "shared": module._launch_triton_twice.compiled[(("float32", "float32"), (4096,))] is
                     launcher.compiled[(("float32", "float32"), (4096,))]}
    if mode == "cold":
        product = {"kernels": {"triton_double": described}}
        graph_cache.record_binaries(product, {"triton_double": types.SimpleNamespace(__globals__=vars(module))})
        json.dump(product, open(product_file, "w"))
        open(blob, "wb").write(kiln.save_cache_artifacts())
    if device == "cuda":
        x = torch.randn(4096, device="cuda")
        y = torch.empty_like(x)
        launcher(4, x, y, 4096)
        out["error"] = float((y - 2 * x).abs().max())
    print(json.dumps(out))
''')


def _child(root: Path, mode: str, version: str = "", caches: Path | None = None) -> dict:
    """Run CHILD (`mode`: cold, warm, server) with the product and artifacts under `root`, over the caches under
    `caches` (kiln's and Triton's; by default `root`'s, shared by the cold and warm processes)."""
    caches = caches or root
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KILN_CACHE_DIR=str(caches / "kiln"), TRITON_CACHE_DIR=str(caches / "triton"), KILN_BUILD_JOBS="1",
               PYTHONPATH=os.pathsep.join([str(Path(kiln.__file__).parents[1]), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CHILD, mode, DEVICE, str(root / "product.json"),
                           str(root / "artifacts.bin"), version],
                          input=KERNELS, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, dict]:
    """Caches a cold process filled (its two specializations compiled and kept), and what it said."""
    root = tmp_path_factory.mktemp("triton_binaries")
    built = _child(root, "cold")
    assert "JITFunction.run" in built["jit"] and built["stats"]["stored"] == 2, built  # two distinct binaries
    return root, built


@pytest.fixture
def cold(compiled, tmp_path) -> tuple[Path, dict]:
    """A copy of the cold process's caches for one test (Triton's file lists name the original's, which stays)."""
    root, built = compiled
    shutil.copytree(root, tmp_path / "caches")
    return tmp_path / "caches", built


def _stored_files(root: Path, suffix: str) -> list[Path]:
    return sorted((root / "kiln" / "triton-bin").glob(f"*/*.{suffix}"))


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_stored_binary_loads_through_the_jit_and_is_kept_again(cold):
    root, built = cold
    damaged = _stored_files(root, "cubin")[0]
    intact = damaged.read_bytes()
    _damage(damaged)
    warm = _child(root, "warm")
    assert "JITFunction.run" in warm["jit"] and warm["stats"]["refused"] == 1, warm
    assert warm["cubins"] == built["cubins"] and warm["launches"] == built["launches"], "the JIT loads the same"
    if ON_GPU:
        assert warm["error"] == 0.0
    assert verify(damaged) is None and damaged.read_bytes() == intact, "healed: the JIT's binary was kept again"


@pytest.fixture
def stored(compiled, tmp_path, monkeypatch) -> list[dict]:
    """This process reading a copy of the cold process's kiln cache, on an sm_90 driver that only names the target;
    the binaries' descriptions its product recorded."""
    import triton
    from triton.backends.compiler import GPUTarget

    from kiln.codegen.triton.build_worker_process import TargetOnlyDriver
    from kiln.runtime import cache
    from kiln.runtime.private_files import PrivateTree

    root, _ = compiled
    shutil.copytree(root / "kiln", tmp_path / "kiln")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln"))
    monkeypatch.setattr(cache, "_tree", PrivateTree("cache"))
    monkeypatch.setattr(triton_binaries, "_loaded", {})
    monkeypatch.setattr(triton_binaries, "stats", {"stored": 0, "loaded": 0, "refused": 0})
    monkeypatch.setattr(triton.runtime.driver, "_active", TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    return json.loads((root / "product.json").read_text())["kernels"]["triton_double"]["stored"]


def test_a_stored_binary_builds_the_kernel_triton_would_load(stored):
    kernel = triton_binaries.load(stored[0])
    assert kernel.hash == stored[0]["hash"] and kernel.metadata.hash == stored[0]["hash"]
    digest = stored[0]["hash"]
    folder = Path(os.environ["KILN_CACHE_DIR"]) / "triton-bin" / digest[:2]
    assert kernel.kernel == (folder / f"{digest}.cubin").read_bytes()
    assert kernel.src.signature == {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"}
    assert kernel.src.constants == {(3,): 1024}  # what Triton's C launcher is generated from
    assert triton_binaries.load(stored[2]) is kernel, "the kernel's second launcher shares it"


def _another_triton(monkeypatch):
    import triton

    monkeypatch.setattr(triton, "__version__", "0.0-another")


def _another_gpu(monkeypatch):
    import triton
    from triton.backends.compiler import GPUTarget

    from kiln.codegen.triton.build_worker_process import TargetOnlyDriver

    monkeypatch.setattr(triton.runtime.driver, "_active", TargetOnlyDriver(GPUTarget("cuda", 80, 32)))


def _another_environment(monkeypatch):
    monkeypatch.setattr(triton_binaries, "_environment", lambda: {"TRITON_DEFAULT_FP_FUSION": "0"})


@pytest.mark.parametrize("change, reason", [
    (_another_triton, "compiled by Triton"), (_another_gpu, "compiled for"),
    (_another_environment, "other Triton environment variables")])
def test_a_binary_made_for_something_else_is_not_used(stored, monkeypatch, caplog, change, reason):
    change(monkeypatch)
    with caplog.at_level("INFO", logger="kiln.runtime.cache"):
        assert triton_binaries.load(stored[0]) is None
        assert triton_binaries.load(stored[0]) is None  # asked again by another launcher: no second line
    (line,) = [r.getMessage() for r in caplog.records]
    assert reason in line and "Triton's JIT loads the kernel" in line
    assert triton_binaries.stats["refused"] == 1


def test_a_description_that_names_other_files_is_not_used(stored, caplog):
    """The hash the product recorded names the files: another hash is other files (missing here), and a
    metadata file that names another kernel than its own name says is refused."""
    other = dict(stored[0], hash="0" * 64)
    assert triton_binaries.load(other) is None
    root = Path(os.environ["KILN_CACHE_DIR"])
    source = root / "triton-bin" / stored[1]["hash"][:2] / f"{stored[1]['hash']}.json"
    planted = root / "triton-bin" / stored[0]["hash"][:2] / f"{stored[0]['hash']}.json"
    data = source.read_bytes()
    planted.write_bytes(data)  # the other kernel's metadata, its manifest made to match
    manifest_path(planted).write_text(json.dumps({"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    with caplog.at_level("INFO", logger="kiln.runtime.cache"):
        assert triton_binaries.load(stored[0]) is None
    assert "names another kernel" in caplog.text


def test_a_server_loads_the_kernels_from_the_artifacts_without_triton_jit(compiled, tmp_path):
    """The artifacts carry kiln's copies of the binaries: a server starting from them and empty caches loads each
    kernel as a warm process does."""
    root, built = compiled
    stored = json.loads((root / "product.json").read_text())["kernels"]["triton_double"]["stored"]
    assert len(stored) == 3 and len(_stored_files(root, "cubin")) == 2  # three launchers, two binaries
    served = _child(root, "server", caches=tmp_path)
    assert served["jit"] == [], "no JITFunction.run and no triton_key"
    assert served["stats"] == {"stored": 0, "loaded": 2, "refused": 0}, served
    assert served["cubins"] == built["cubins"] and served["launches"] == built["launches"]
    assert served["fast_ints"] == built["fast_ints"] == [4096]
    assert served["shared"] and built["shared"], "one binary for both launchers of the kernel, as Triton's JIT has"
    assert len(_stored_files(tmp_path, "cubin")) == 2
    if ON_GPU:
        assert served["error"] == 0.0


# A small training step's graphs compiled by kiln's whole pipeline for CUDA on fake tensors (no GPU: kernels
# compiled for sm_90, nothing launched; tests/support/fake_cuda.py), and what each Triton launcher holds after the
# compile: its specializations, its fast path and the hashes of its binaries.
PIPELINE = textwrap.dedent('''
    import json
    import torch, torch.nn as nn, triton
    import triton.runtime.cache as triton_runtime_cache
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction
    from kiln.codegen import triton as triton_target
    from kiln.codegen.triton import build_worker_process, launch
    from kiln.runtime import graph_cache, triton_binaries
    from support.fake_cuda import compile_model

    triton.runtime.driver.set_active(build_worker_process.TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    launch._direct_launch = lambda binary: (None, ())
    jit = []
    run, key = JITFunction.run, triton_runtime_cache.triton_key
    JITFunction.run = lambda *a, **k: jit.append("JITFunction.run") or run(*a, **k)
    triton_runtime_cache.triton_key = lambda: jit.append("triton_key") or key()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 64))
    graphs = compile_model(model, [torch.randn(8, 64)], train=True, amp=None)
    launchers = {f"{module.__name__}.{name}": {"launches": sorted(map(repr, value.launches)),
                                               "fast_ints": list(value.fast_ints), "fast": value.fast is not None,
                                               "binaries": sorted(b.hash for b in value.compiled.values())}
                 for module in triton_target._loaded.values() for name, value in vars(module).items()
                 if isinstance(value, launch.Launcher)}
    print(json.dumps({"jit": sorted(set(jit)), "stats": triton_binaries.stats, "hits": graph_cache.stats["hits"],
                      "kernels": sum(g.num_kernels for g in graphs), "launchers": launchers}))
''')


def test_a_warm_compile_loads_the_cold_kernels_for_the_same_launches_without_triton_jit(tmp_path):
    """Through the whole pipeline (the AOT and compile caches, the products' kernels): the warm process's
    launchers hold the cold one's binaries, for the same specializations and fast paths, and Triton's JIT never
    runs (nor is Triton's installation hashed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KILN_CACHE_DIR=str(tmp_path / "kiln"), TRITON_CACHE_DIR=str(tmp_path / "triton"), KILN_BUILD_JOBS="1",
               KILN_GRAPH_CACHE="1", PYTHONPATH=os.pathsep.join([str(Path(kiln.__file__).parents[1]),
                                                                   str(Path(__file__).parents[1]),
                                                                   env.get("PYTHONPATH", "")]))
    said = []
    for _ in ("cold", "warm"):
        done = subprocess.run([sys.executable, "-c", PIPELINE], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0 and "fell back" not in done.stderr, done.stderr
        said.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = said
    binaries = {h for launcher in cold["launchers"].values() for h in launcher["binaries"]}
    assert cold["kernels"] > 0 and cold["stats"]["stored"] == len(binaries) > 0, cold
    assert warm["hits"] == 2 and warm["jit"] == [], warm
    assert warm["stats"] == {"stored": 0, "loaded": cold["stats"]["stored"], "refused": 0}, warm
    assert warm["launchers"] == cold["launchers"]
    assert all(launcher["fast"] for launcher in warm["launchers"].values())


# A model compiled on the GPU in a fresh process: its forward and backward against eager's, and the calls into
# Triton's JIT the compile and the steps made.
MODEL = textwrap.dedent('''
    import json
    import torch, torch.nn as nn
    import triton.runtime.cache as triton_runtime_cache
    from triton.runtime.jit import JITFunction
    import kiln
    from kiln.runtime import triton_binaries

    jit = []
    run, key = JITFunction.run, triton_runtime_cache.triton_key
    JITFunction.run = lambda *a, **k: jit.append("JITFunction.run") or run(*a, **k)
    triton_runtime_cache.triton_key = lambda: jit.append("triton_key") or key()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 8)).cuda()
    x = torch.randn(32, 64, device="cuda")
    compiled = kiln.compile(model)
    loss = compiled(x).square().mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x).square().mean()
    expected.backward()
    error = max([float((loss - expected).abs())] + [float((g - p.grad).abs().max())
                                                     for g, p in zip(grads, model.parameters())])
    print(json.dumps({"jit": sorted(set(jit)), "stats": triton_binaries.stats, "error": error}))
''')


@pytest.mark.skipif(not ON_GPU, reason="runs kernels: needs a CUDA device (KILN_TRITON_TEST_DEVICE=cuda)")
def test_a_warm_process_compiles_a_model_with_no_triton_jit_and_the_same_results(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KILN_CACHE_DIR=str(tmp_path / "kiln"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=os.pathsep.join([str(Path(kiln.__file__).parents[1]), env.get("PYTHONPATH", "")]))
    said = []
    for _ in ("cold", "warm"):
        done = subprocess.run([sys.executable, "-c", MODEL], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        said.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = said
    assert cold["stats"]["stored"] > 0 and "JITFunction.run" in cold["jit"], cold
    assert warm["jit"] == [] and warm["stats"]["loaded"] == cold["stats"]["stored"], warm
    assert warm["stats"]["refused"] == 0
    assert cold["error"] < 1e-4 and warm["error"] < 1e-4, said

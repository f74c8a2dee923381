"""What a warm process on the GPU does before its first kernel lookup, and what it leaves out.

A cached product records where Triton's cache keeps each kernel's binaries (kiln/runtime/triton_cache.py): a
kernel found there is loaded in the graph's process, and no build worker starts (each imports torch and Triton,
seconds of CPU that a warm process's first steps would compete with). Triton's key of its own installation,
which the first JIT lookup needs, is hashed in the background from the moment a GPU graph's kernels are to be
built, and once: the precompile pool's threads wait for it rather than each hashing Triton.
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from kiln.codegen import triton as triton_target  # noqa: E402
from kiln.runtime import triton_cache  # noqa: E402


def test_a_kernel_whose_binaries_are_cached_is_not_sent_to_the_build_workers(tmp_path, monkeypatch):
    """A cached product's kernel records where Triton's cache keeps its binaries: found there, it is loaded in
    the graph's process and no build worker starts; one missing is compiled in the workers as before."""
    import triton

    from kiln.codegen.triton import build_workers
    from kiln.runtime.graph_cache import KernelSignature

    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path))
    entry = "A" * 52
    (tmp_path / entry).mkdir()
    (tmp_path / entry / "__grp__triton_double.json").write_text("{}")

    class Module:
        __file__, __name__ = "kernels.py", "kernels"
        _launch_triton_double = type("Launcher", (), {"fn": None, "constexprs": {}, "options": {}})()

    def kernel(binaries):
        return KernelSignature(["in_ptr0", "out_ptr0"], [], False, [["_launch_triton_double", ["float32"] * 2,
                                                                     [4096]]], binaries)

    assert build_workers.requests_for(Module, {"k": kernel([f"{entry}/__grp__triton_double.json"])}) == []
    monkeypatch.setattr(build_workers, "start", lambda device: pytest.fail("build workers started"))
    triton_target._build_in_workers(Module, {"k": kernel([f"{entry}/__grp__triton_double.json"])}, "cuda:0")
    for missing in ([f"{'B' * 52}/__grp__triton_double.json"], None):
        assert len(build_workers.requests_for(Module, {"k": kernel(missing)})) == 1


def test_tritons_own_key_is_hashed_once_in_the_background(monkeypatch):
    import triton.runtime.cache

    calls = []
    monkeypatch.setattr(triton.runtime.cache, "triton_key", lambda: calls.append("hashed"))
    monkeypatch.setattr(triton_cache, "_key_thread", None)
    triton_cache.hash_triton_early()
    triton_cache.hash_triton_early()  # a second GPU graph: already started
    triton_cache._key_thread.join(timeout=10)
    assert calls == ["hashed"]
    assert triton_cache._key_thread.daemon  # never holds the process's exit


def test_threads_that_each_look_a_kernel_up_wait_for_one_hash(monkeypatch):
    """Triton memoizes its key without a lock: the precompile pool's threads, missing it together, each hashed
    Triton. `hashed_triton` (before the pool starts) computes it once, joining a hash already under way."""
    import threading
    import time

    import triton.runtime.cache

    calls = []

    def slow_key():
        calls.append(threading.current_thread().name)
        time.sleep(0.2)

    monkeypatch.setattr(triton.runtime.cache, "triton_key", slow_key)
    monkeypatch.setattr(triton_cache, "_key_thread", None)
    threads = [threading.Thread(target=triton_cache.hashed_triton) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert calls == ["kiln-triton-key"] and not triton_cache._key_thread.is_alive()


def test_a_failing_hash_is_left_for_the_lookup_to_raise(monkeypatch):
    import threading

    import triton.runtime.cache

    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    monkeypatch.setattr(triton.runtime.cache, "triton_key", lambda: 1 / 0)
    monkeypatch.setattr(triton_cache, "_key_thread", None)
    triton_cache.hash_triton_early()
    triton_cache._key_thread.join(timeout=10)
    assert escaped == []  # nothing printed from a thread; the kernel lookup computes the key and raises there


def test_a_product_records_each_kernels_binaries_from_its_launchers():
    """After the build, each kernel's entry in the product lists the Triton cache entries its launchers loaded; a
    kernel with a launcher that recorded none (the interpreter, another cache manager) lists nothing, and is
    compiled in the build workers if a warm process finds it (as before)."""
    from types import SimpleNamespace

    from kiln.runtime.graph_cache import KernelSignature, record_binaries

    module = {"_launch_a": SimpleNamespace(binaries={"E1/__grp__a.json"}),
              "_launch_a_split": SimpleNamespace(binaries={"E2/__grp__a.json"}),
              "_launch_b": SimpleNamespace(binaries=set())}
    exec("def k1(*args): pass\ndef k2(*args): pass", module)
    product = {"kernels": {"k1": {"precompiles": [["_launch_a", ["float32"], [4]],
                                                  ["_launch_a_split", ["float32"], [4]]]},
                           "k2": {"precompiles": [["_launch_b", ["float32"], [4]]]},
                           "cpp_kernel": {"precompiles": None}}}
    record_binaries(product, {"k1": module["k1"], "k2": module["k2"], "cpp_kernel": object()})
    assert product["kernels"]["k1"]["binaries"] == ["E1/__grp__a.json", "E2/__grp__a.json"]
    assert "binaries" not in product["kernels"]["k2"] and "binaries" not in product["kernels"]["cpp_kernel"]
    signature = KernelSignature(["in_ptr0"], [], False, **product["kernels"]["k1"])
    assert signature.binaries == ["E1/__grp__a.json", "E2/__grp__a.json"]

"""Triton's compiled kernels travel with kiln's cache artifacts (kiln/runtime/triton_cache.py).

A server that loads a blob into empty caches must not compile a kernel again: the blob carries what Triton
compiled (each kernel's metadata and GPU binary), published into Triton's own cache so that Triton's lookup
finds them there. Kernels compiled for another GPU are left out, and an entry that is damaged or not what it
says it is makes the whole blob refused.

No GPU is needed: child processes compile for sm_90 behind a driver that only names the target, as the build
workers do (kiln/codegen/triton/build_workers.py), with Triton's front end counted.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.codegen import triton as triton_target  # noqa: E402
from kiln.runtime import artifacts, triton_cache  # noqa: E402
from support.triton_sm90 import DOUBLING_KERNEL  # noqa: E402

KERNELS = triton_target.HEADER + DOUBLING_KERNEL

# One process of a GPU host, but for the GPU: it compiles (or finds) the kernel's two specializations through
# `Launcher.precompile`, as a graph's build does; loading a binary onto a GPU is the one step left out.
CHILD = textwrap.dedent('''
    import json, sys
    import torch, triton
    import triton.compiler.compiler as triton_compiler
    from triton.backends.compiler import GPUTarget
    import kiln
    from kiln.codegen.triton import build_worker_process, launch, load_module

    mode, blob = sys.argv[1], sys.argv[2]
    triton.runtime.driver.set_active(build_worker_process.TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    launch._direct_launch = lambda binary: (None, ())  # no GPU to load the binary onto
    loaded = kiln.load_cache_artifacts(open(blob, "rb").read()) if mode == "load" else {}
    front_end_runs = []
    make_ir = triton_compiler.ASTSource.make_ir
    triton_compiler.ASTSource.make_ir = lambda self, *a: front_end_runs.append(self.name) or make_ir(self, *a)
    launcher = load_module(sys.stdin.read())._launch_triton_double
    for dtype in (torch.float32, torch.bfloat16):
        launcher.precompile([dtype, dtype], [4096])
    if mode == "save":
        open(blob, "wb").write(kiln.save_cache_artifacts())
    print(json.dumps({"loaded": loaded, "front_end_runs": front_end_runs, "binaries": sorted(launcher.binaries)}))
''')


def _child(tmp_path: Path, name: str, mode: str, blob: Path) -> dict:
    """Run CHILD over empty caches of its own (kiln's and Triton's, under `tmp_path/name`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KILN_CACHE_DIR=str(tmp_path / name / "kiln"), TRITON_CACHE_DIR=str(tmp_path / name / "triton"),
               PYTHONPATH=os.pathsep.join([str(Path(kiln.__file__).parents[1]), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(blob)], input=KERNELS,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    """A blob saved by a process that compiled the kernel's two specializations for sm_90, and what it said."""
    tmp = tmp_path_factory.mktemp("triton_artifacts")
    blob = tmp / "artifacts.bin"
    built = _child(tmp, "build", "save", blob)
    assert sorted(built["front_end_runs"]) == ["triton_double", "triton_double"], built
    return blob, built


def test_a_blob_loaded_into_empty_caches_compiles_nothing_again(saved, tmp_path):
    blob, built = saved
    served = _child(tmp_path, "server", "load", blob)
    assert served["loaded"].get("triton-cache") == 2, served  # the two specializations' entries
    assert served["front_end_runs"] == [], "every kernel came from Triton's cache"
    assert served["binaries"] == built["binaries"] and len(built["binaries"]) == 2
    assert all((tmp_path / "server" / "triton" / entry).is_file() for entry in served["binaries"])


def test_kernels_for_another_gpu_are_left_out(saved, fresh_cache, tmp_path, monkeypatch):
    blob, _ = saved
    monkeypatch.setattr(triton_cache, "_here", lambda version: (tmp_path / "triton", ["cuda", 80, 32]))  # an A100
    (tmp_path / "triton").mkdir()
    loaded = kiln.load_cache_artifacts(blob.read_bytes())
    assert loaded["triton-cache skipped (built for another GPU)"] == 2 and "triton-cache" not in loaded, loaded
    assert list((tmp_path / "triton").iterdir()) == []


def _header(blob: bytes) -> tuple[dict, int]:
    """The blob's header and where its files start."""
    (size,) = struct.unpack_from("<Q", blob, len(artifacts.MAGIC))
    start = len(artifacts.MAGIC) + 8
    return json.loads(blob[start:start + size]), start + size


def _rebuilt(blob: bytes, change) -> bytes:
    """`blob` with `change(header, files)` applied to its header and files (a list of bytes), every hash made to
    match again: what is left to refuse it is what the files say, not their hashes."""
    header, offset = _header(blob)
    files = []
    for entry in header["entries"]:
        files.append(blob[offset:offset + entry["size"]])
        offset += entry["size"]
    change(header, files)
    for entry, data in zip(header["entries"], files):
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    encoded = json.dumps(header).encode()
    return artifacts.MAGIC + struct.pack("<Q", len(encoded)) + encoded + b"".join(files)


def _triton_file(header: dict, suffix: str) -> int:
    return next(k for k, e in enumerate(header["entries"])
                if e["path"].startswith("triton-cache/") and e["path"].endswith(suffix))


def _metadata_of_another_kernel(header, files):
    k = _triton_file(header, ".json")
    metadata = json.loads(files[k])
    metadata["hash"] = hashlib.sha256(b"another kernel").hexdigest()
    files[k] = json.dumps(metadata).encode()


def _target_that_differs_from_the_metadata(header, files):
    entry = header["entries"][_triton_file(header, ".json")]["path"].split("/")[1]
    header["triton"]["entries"][entry]["target"] = ["cuda", 80, 32]


def _file_list_of_triton_its_own(header, files):
    k = _triton_file(header, ".json")
    path = header["entries"][k]["path"]
    header["entries"].append({"path": path.rsplit("/", 1)[0] + "/__grp__planted.json"})
    files.append(json.dumps({"child_paths": {"x.cubin": "/etc/passwd"}}).encode())


def _entry_not_described(header, files):
    header["triton"]["entries"] = {}


@pytest.mark.parametrize("damage, message", [
    (_metadata_of_another_kernel, "not the kernel its metadata describes"),
    (_target_that_differs_from_the_metadata, "not the kernel its metadata describes"),
    (_file_list_of_triton_its_own, "names a file kiln does not keep"),
    (_entry_not_described, "Triton entries are not described")])
def test_a_triton_entry_that_is_not_what_it_says_is_refused(saved, fresh_cache, tmp_path, monkeypatch, damage,
                                                           message):
    blob, _ = saved
    import triton

    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path / "triton"))
    bad = _rebuilt(blob.read_bytes(), damage)
    with pytest.raises(ValueError, match=message):
        kiln.load_cache_artifacts(bad)
    assert not (tmp_path / "triton").exists() and not fresh_cache.exists(), "nothing was written"


def test_a_corrupted_binary_is_refused(saved, fresh_cache):
    blob, _ = saved
    data = bytearray(blob.read_bytes())
    header, offset = _header(data)
    for entry in header["entries"]:
        if entry["path"].endswith(".cubin"):
            data[offset + entry["size"] // 2] ^= 0xFF
            break
        offset += entry["size"]
    with pytest.raises(ValueError, match="damaged"):
        kiln.load_cache_artifacts(bytes(data))
    assert not fresh_cache.exists()


def test_an_entry_is_published_whole_and_one_already_there_is_kept(saved, fresh_cache, tmp_path, monkeypatch):
    """Published into Triton's cache as a folder renamed into place (never half an entry); an entry Triton has
    already (a concurrent compile's) is left as it is."""
    blob, _ = saved
    monkeypatch.setattr(triton_cache, "_here", lambda version: (tmp_path / "triton", ["cuda", 90, 32]))
    (tmp_path / "triton").mkdir()
    first, second = sorted(_header(blob.read_bytes())[0]["triton"]["entries"])
    (tmp_path / "triton" / first).mkdir()
    (tmp_path / "triton" / first / "kept").write_text("Triton's own")
    (tmp_path / "triton" / second).mkdir()  # an empty folder, as a lookup that missed leaves
    loaded = kiln.load_cache_artifacts(blob.read_bytes())
    assert loaded["triton-cache"] == 1 and loaded["triton-cache (already there)"] == 1, loaded
    assert os.listdir(tmp_path / "triton" / first) == ["kept"]
    group, = (tmp_path / "triton" / second).glob("__grp__*.json")
    paths = json.loads(group.read_text())["child_paths"]
    assert sorted(Path(p).suffix for p in paths.values()) == [".cubin", ".json"]
    assert all(Path(p).parent == tmp_path / "triton" / second and Path(p).is_file() for p in paths.values())
    assert not [p for p in (tmp_path / "triton").iterdir() if p.name.startswith("tmp")]


def test_kernels_of_another_triton_are_left_out(saved, fresh_cache, tmp_path, monkeypatch):
    """Triton's cache key hashes Triton itself: another version's entries would never be looked up here."""
    blob, _ = saved
    import triton

    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path / "triton"))
    loaded = kiln.load_cache_artifacts(_rebuilt(blob.read_bytes(),
                                                lambda header, files: header["triton"].update(version="0.0")))
    assert loaded["triton-cache skipped (built by another Triton)"] == 2, loaded
    assert not (tmp_path / "triton").exists()


def _launcher_in(root: Path, name: str) -> object:
    """A stand-in for a CompiledKernel's `run` whose C launcher was loaded from Triton's cache under `root`."""
    from types import SimpleNamespace

    entry = root / ("L" * 52)
    entry.mkdir(parents=True)
    (entry / name).write_bytes(b"\x7fELF a launcher")
    return SimpleNamespace(launch=SimpleNamespace(__self__=SimpleNamespace(__file__=str(entry / name))))


@pytest.mark.parametrize("platform, written", [(None, 1), (["riscv64", "Linux", ".so"], 0)])
def test_c_launchers_travel_for_the_same_platform_only(fresh_cache, tmp_path, monkeypatch, platform, written):
    """Triton builds a C launcher per kernel signature with the C compiler; it is carried so that a server needs no
    compiler, and left out where the blob came from another machine type or Python."""
    import sysconfig

    import triton

    monkeypatch.setattr(triton_cache, "_used", {})
    # the driver's own extension is the next test's: on a GPU, reading it here would build it into this cache
    monkeypatch.setattr(triton_cache, "_utils_recorded", True)
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path / "built"))
    name = f"{triton_cache.LAUNCHER_PREFIX}{sysconfig.get_config_var('EXT_SUFFIX')}"
    triton_cache.record_launcher(_launcher_in(tmp_path / "built", name))
    triton_cache.record_launcher(object())  # a launcher not from an extension module: nothing to carry
    blob = kiln.save_cache_artifacts()
    if platform is not None:
        blob = _rebuilt(blob, lambda header, files: header["triton"]["entries"]["L" * 52].update(platform=platform))
    monkeypatch.setattr(triton_cache, "_here", lambda version: (tmp_path / "served", ["cuda", 90, 32]))
    (tmp_path / "served").mkdir()
    loaded = kiln.load_cache_artifacts(blob)
    assert loaded.get("triton-cache", 0) == written, loaded
    published = tmp_path / "served" / ("L" * 52) / name
    assert published.is_file() == bool(written)
    if written:
        assert published.read_bytes() == b"\x7fELF a launcher"
        assert not list(published.parent.glob("__grp__*"))  # a launcher has no file list: Triton asks for the file


def test_the_driver_extension_travels_with_the_launchers(fresh_cache, tmp_path, monkeypatch):
    """Triton's driver compiles its own C extension (`cuda_utils`, which loads binaries onto the GPU) into its cache
    the first time a process needs it: carried once, a server starting from empty caches runs no C compiler."""
    import sysconfig
    from types import SimpleNamespace

    import triton

    monkeypatch.setattr(triton_cache, "_used", {})
    monkeypatch.setattr(triton_cache, "_utils_recorded", False)
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path / "built"))
    utils = f"cuda_utils{sysconfig.get_config_var('EXT_SUFFIX')}"
    entry = tmp_path / "built" / ("U" * 52)
    entry.mkdir(parents=True)
    (entry / utils).write_bytes(b"\x7fELF the driver's utilities")
    module = SimpleNamespace(__file__=str(entry / utils))
    monkeypatch.setattr(triton.runtime.driver, "_active", SimpleNamespace(utils=SimpleNamespace(
        load_binary=SimpleNamespace(__self__=module))))
    name = f"{triton_cache.LAUNCHER_PREFIX}{sysconfig.get_config_var('EXT_SUFFIX')}"
    triton_cache.record_launcher(_launcher_in(tmp_path / "built", name))
    monkeypatch.setattr(triton_cache, "_here", lambda version: (tmp_path / "served", ["cuda", 90, 32]))
    (tmp_path / "served").mkdir()
    loaded = kiln.load_cache_artifacts(kiln.save_cache_artifacts())
    assert loaded.get("triton-cache") == 2, loaded
    assert (tmp_path / "served" / ("U" * 52) / utils).read_bytes() == b"\x7fELF the driver's utilities"

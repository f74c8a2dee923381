"""Compiled Triton kernels kept in kiln's own cache, loaded by a warm process without Triton's JIT.

A kernel reached through Triton's JIT (`JITFunction.warmup` or a launch) costs a warm process its lookup even when
the binary is in Triton's cache: the JIT binds the arguments, builds its binder, and keys the compile by
`triton_key()`, a hash of Triton's whole installation (its sources walked with pkgutil and every file read),
before it finds the entry. Inductor's warm start skips all of that by keeping the compiled binary with its
metadata and launching it directly; so does kiln, here.

When a cold process has loaded a kernel (`Launcher.precompile`), `store` copies what Triton compiled into
`triton-bin/<h[:2]>/<h>.json` (Triton's metadata, verbatim) and `<h>.cubin` (the GPU binary; `.hsaco`/`.zebin` on
other backends), `h` being Triton's hash of the compile, each published with a manifest like every kiln artifact
(kiln/runtime/private_files.py). It returns what a loader needs besides the files (the kernel's argument
signature and constants, which Triton's C launcher is generated from, and the environment variables that change
a Triton compile), which the graph's product keeps per launcher (kiln/runtime/graph_cache.py).

A warm process's `load` checks both files against their manifests, that the metadata names the hash the product
recorded, this process's Triton version, the GPU target of the current device and the same environment, and then
builds Triton's `CompiledKernel` from the files: no `triton.compile`, no `JITFunction`, no `triton_key()`.
Anything missing, damaged or made for something else is one log line and None: the launcher goes through
Triton's JIT as a cold process does, and what the JIT loaded is stored again (a damaged file is replaced, so the
next process finds it whole). The C launcher for the kernel's signature is still Triton's (from its cache, or
compiled), as in a JIT load.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

from kiln.runtime import cache
from kiln.runtime.private_files import discard, publish, temp_name, verify
from kiln.runtime.triton_cache import BINARY_SUFFIX

log = logging.getLogger("kiln.runtime.cache")

FOLDER = "triton-bin"
# What this process did, in distinct binaries: `stored`, `loaded` without Triton's JIT, and `refused` (the JIT
# loads them).
stats = {"stored": 0, "loaded": 0, "refused": 0}

_PLAIN = (bool, int, float, str, type(None))
_loaded: dict[tuple, object] = {}  # (hash, device) -> the CompiledKernel, or None where it was refused
_kept: set[str] = set()  # the hashes this process stored
_lock = threading.Lock()


def _paths(digest: str, suffix: str) -> tuple[Path, Path]:
    folder = cache.folder(FOLDER, digest[:2])
    return folder / f"{digest}.json", folder / f"{digest}.{suffix}"


def _environment() -> dict:
    """The environment variables that change what Triton compiles (Triton's own list)."""
    import triton

    return dict(triton._C.libtriton.get_cache_invalidating_env_vars())


def describe(binary) -> dict | None:
    """What loading `binary` (a Triton CompiledKernel) again needs besides its files, as plain data; None where
    it is not one kiln can store: no AST source (signature, constants), a constant that is not plain data, a
    backend whose binary kiln does not know, or a hash that cannot name a file."""
    src, metadata = getattr(binary, "src", None), getattr(binary, "metadata", None)
    suffix = BINARY_SUFFIX.get(getattr(getattr(metadata, "target", None), "backend", None))
    digest = getattr(binary, "hash", None)
    signature, constants = getattr(src, "signature", None), getattr(src, "constants", None)
    if suffix is None or not isinstance(signature, dict) or not isinstance(constants, dict) \
            or not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        return None
    if not all(isinstance(k, tuple) and isinstance(v, _PLAIN) for k, v in constants.items()):
        return None
    return {"hash": digest, "binary": suffix, "name": binary.name, "arg_names": list(src.fn.arg_names),
            "signature": dict(signature), "constants": [[list(k), v] for k, v in constants.items()],
            "environment": _environment()}


def store(binary) -> dict | None:
    """Keep `binary`'s metadata and GPU binary in kiln's cache (once per hash: an entry that checks out is kept);
    its description for `load`, or None where it cannot be stored."""
    described = describe(binary)
    group = getattr(binary, "metadata_group", None) or {}
    metadata = next((p for name, p in group.items() if name.endswith(".json")), None)
    if described is None or metadata is None:
        return None
    paths = _paths(described["hash"], described["binary"])
    try:
        sources = (Path(metadata).read_bytes(), binary.kernel)
        for path, data in zip(paths, sources):
            if verify(path) is not None:
                _publish(path, data)
            cache.record_use(path)
    except OSError as e:  # a full or read-only cache: the next warm process loads through Triton's JIT
        log.info("kiln: could not keep the Triton binary %s (%s)", described["hash"], e)
        return None
    with _lock:
        if described["hash"] not in _kept:
            _kept.add(described["hash"])
            stats["stored"] += 1
    return described


def _publish(path: Path, data: bytes) -> None:
    tmp = temp_name(path)
    try:
        cache.write_new(tmp, data)
        publish(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def load(described: dict):
    """The Triton CompiledKernel `described` (by `store`) names, built from kiln's files; None (after one log
    line) where they are missing, damaged, or made by another Triton, for another GPU or environment.

    One per hash and device in a process, as Triton's JIT keeps one per specialization and device: launchers of
    kernels equal up to names (kiln/codegen/triton/shared_kernels.py) share it, and its module and C launcher
    are loaded once."""
    key = (described.get("hash") if isinstance(described, dict) else None, _current_device())
    with _lock:
        if key in _loaded:
            return _loaded[key]
        _loaded[key] = kernel = _load(described)
    return kernel


def _current_device():
    """The device Triton loads a binary onto now (None where its driver cannot say: the load then fails, logged)."""
    import triton

    try:
        return triton.runtime.driver.active.get_current_device()
    except Exception:  # noqa: BLE001 -- no usable driver: `_load` refuses with the reason
        return None


def _load(described: dict):
    try:
        problem, paths = _check(described)
    except Exception as e:  # noqa: BLE001 -- a description kiln cannot read: Triton's JIT loads the kernel
        problem, paths = f"{type(e).__name__}: {e}", None
    if problem is None:
        try:
            return _compiled_kernel(described, paths)
        except Exception as e:  # noqa: BLE001 -- a Triton whose CompiledKernel differs: its JIT loads the kernel
            problem = f"not loadable here ({type(e).__name__}: {e})"
    stats["refused"] += 1
    log.info("kiln: the stored Triton binary %s is not used (%s); Triton's JIT loads the kernel",
             described.get("hash") if isinstance(described, dict) else described, problem)
    return None


def _check(described: dict) -> tuple[str | None, tuple[Path, Path] | None]:
    """(why the stored binary cannot serve here or None, its two files)."""
    import triton

    digest, suffix = described["hash"], described["binary"]
    if suffix not in BINARY_SUFFIX.values() or len(digest) != 64 or digest.strip("0123456789abcdef"):
        return "a description kiln does not know", None
    paths = _paths(digest, suffix)
    for path in paths:
        problem = verify(path)
        if problem is not None:
            if problem != "missing":
                cache.rebuild_log(path, problem)
                discard(path)
            return f"{path.name}: {problem}", None
        cache.record_use(path)
    metadata = json.loads(paths[0].read_bytes())
    target = triton.runtime.driver.active.get_current_target()
    stored_target = metadata.get("target") or {}
    if metadata.get("hash") != digest:
        return "its metadata names another kernel", None
    if metadata.get("triton_version") != triton.__version__:
        return f"compiled by Triton {metadata.get('triton_version')}, this is {triton.__version__}", None
    if [stored_target.get("backend"), stored_target.get("arch"), stored_target.get("warp_size")] != \
            [target.backend, target.arch, target.warp_size]:
        return f"compiled for {stored_target}, this GPU is {target}", None
    if described["environment"] != _environment():
        return "compiled under other Triton environment variables", None
    return None, paths


def _compiled_kernel(described: dict, paths: tuple[Path, Path]):
    """Triton's CompiledKernel over kiln's files, with a source that tells Triton's launcher builder what the
    JIT's would: the signature, the constants and the argument names."""
    import triton

    name = described["name"]
    fn = SimpleNamespace(arg_names=list(described["arg_names"]), launch_metadata=None, __name__=name)
    src = SimpleNamespace(fn=fn, name=name, signature=dict(described["signature"]),
                          constants={tuple(k): v for k, v in described["constants"]})
    group = {f"{name}.json": str(paths[0]), f"{name}.{described['binary']}": str(paths[1])}
    kernel = triton.compiler.CompiledKernel(src, group, described["hash"])
    stats["loaded"] += 1
    return kernel


__all__ = ["store", "load", "describe", "stats", "FOLDER"]

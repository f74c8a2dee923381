"""Portable cache artifacts: what this process compiled with, as bytes another machine starts warm from.

    blob = kiln.save_cache_artifacts()      # after the model ran (compiled) once
    ...
    kiln.load_cache_artifacts(blob)         # in a fresh process or on another machine, before compiling

As torch.compiler.save_cache_artifacts / load_cache_artifacts. The blob holds every file of the cache
this process compiled with (kiln/runtime/cache.py `used()`): the captured graphs' ATen graphs
(kiln/autograd/aot_cache.py), the compiled graphs' products (kiln/runtime/graph_cache.py), the C++ libraries
(the kernels', and the guards' extension, kiln/capture/tensor_checks.py, which a fresh cache would otherwise build
while the first calls run), the autotuning decisions, the Triton modules and their compiled kernels as kiln keeps
them (kiln/runtime/triton_binaries.py: loaded without Triton's JIT), the code objects of the wrappers and
guard functions (kiln/runtime/code_cache.py: for the same Python only), and what Triton compiled of those
modules (each kernel's metadata and GPU binary, and the C launchers, from Triton's own cache:
kiln/runtime/triton_cache.py), each with its size and SHA-256, and the environment it was made in.

Loading checks before it writes anything: the format, that every path is one of the cache's own
kinds of file (no `..`, no absolute path), and every file's hash; a blob that fails any check is
refused whole (ValueError) and the cache is left as it was. Files are published like a build's
(temporary name, manifest, rename). C++ libraries built for another CPU are left out (a product's
kernel source builds them again here; the guards' extension builds in the background), and a blob from another
kiln, torch or Python is loaded but its products never match a key here: they are simply not used. Triton's
entries go into Triton's cache folder, each whole or not at all; those compiled for another GPU target, by another
Triton, or (launchers) for another platform or Python are left out. A blob runs code on load: trust it as you
would trust the model's source.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct

from kiln.runtime import cache, graph_cache, triton_cache
from kiln.runtime.private_files import publish, temp_name, verify

MAGIC = b"KILN-CACHE-ARTIFACTS\x00"
VERSION = 1
# The files a blob may hold: a folder of the cache's, a two-character shard, a file named by its key.
_ALLOWED = re.compile(r"^(cpp/[0-9a-f]{2}/[0-9a-f]{64}\.(so|cpp)|(graphs|aot)/[0-9a-f]{2}/[0-9a-f]{64}\.json"
                      r"|autotune/[0-9a-f]{2}/[0-9a-f]{64}\.json|triton/[0-9a-f]{2}/[0-9a-f]{64}\.py"
                      r"|code/[0-9a-f]{2}/[0-9a-f]{64}\.marshal"
                      r"|triton-bin/[0-9a-f]{2}/[0-9a-f]{64}\.(json|cubin|hsaco|zebin)"
                      r"|ext/[0-9a-f]{16}/kiln_tensor_checks\.[A-Za-z0-9_-]+\.so"
                      r"|triton-cache/[A-Z2-7]{52}/(?!__grp__)[A-Za-z0-9_][A-Za-z0-9_.-]{0,200})$")
TRITON = "triton-cache/"  # Triton's own cache entries (kiln/runtime/triton_cache.py), published into its folder


# files published with a manifest, checked before they are saved
_MANIFESTED = ("cpp/", "graphs/", "aot/", "ext/", "triton-bin/", "code/")
_BUILT_FOR_THIS_CPU = ("cpp", "ext")  # machine code: left out of a blob loaded on another CPU


def save_cache_artifacts() -> bytes:
    """Every cache file this process compiled with, as one blob for `load_cache_artifacts`."""
    entries, payload = [], []
    triton_entries, triton_files = triton_cache.saved_files()
    for relative, path in sorted(cache.used().items()) + triton_files:
        if relative.startswith(_MANIFESTED) and verify(path) is not None:
            continue  # removed or broken since: the blob carries only what checks out
        files = [(relative, path)]
        if relative.startswith("cpp/"):  # the kernels' source beside the library, for reading
            files.append((relative[:-3] + ".cpp", path.with_suffix(".cpp")))
        for name, file in files:
            try:
                data = file.read_bytes()
            except OSError:
                continue
            entries.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            payload.append(data)
    header = json.dumps({"version": VERSION, "environment": graph_cache.environment(), "entries": entries,
                         "triton": triton_entries}).encode()
    return MAGIC + struct.pack("<Q", len(header)) + header + b"".join(payload)


def load_cache_artifacts(blob: bytes) -> dict:
    """Put the files of `blob` into this process's cache (checked first, see the module docstring); returns
    how many files of each kind were written and how many were left out."""
    entries, files = _read(blob)
    header = _header(blob)
    binaries: dict[str, dict[str, bytes]] = {}  # Triton's entries: entry -> file name -> bytes
    for entry, data in zip(entries, files):
        if entry["path"].startswith(TRITON):
            _, name, file = entry["path"].split("/")
            binaries.setdefault(name, {})[file] = data
    if binaries:
        triton_cache.check(header.get("triton"), binaries)
    same_host = header["environment"].get("host") == graph_cache.host()
    written: dict[str, int] = {}
    for entry, data in zip(entries, files):
        kind = entry["path"].split("/")[0]
        if entry["path"].startswith(TRITON):
            continue
        if kind in _BUILT_FOR_THIS_CPU and not same_host:
            written["skipped (built for another CPU)"] = written.get("skipped (built for another CPU)", 0) + 1
            continue
        _publish(entry["path"], data)
        written[kind] = written.get(kind, 0) + 1
    if binaries:
        for kind, count in triton_cache.publish(header["triton"], binaries).items():
            written[kind] = written.get(kind, 0) + count
    return written


def _header(blob: bytes) -> dict:
    if not isinstance(blob, (bytes, bytearray, memoryview)) or bytes(blob[:len(MAGIC)]) != MAGIC:
        raise ValueError("kiln.load_cache_artifacts: not a blob of kiln.save_cache_artifacts()")
    (size,) = struct.unpack_from("<Q", blob, len(MAGIC))
    start = len(MAGIC) + 8
    try:
        header = json.loads(bytes(blob[start:start + size]))
    except ValueError as e:
        raise ValueError("kiln.load_cache_artifacts: the blob's header is damaged") from e
    if not isinstance(header, dict) or header.get("version") != VERSION:
        raise ValueError("kiln.load_cache_artifacts: a blob of another format version")
    return header


def _read(blob: bytes) -> tuple[list[dict], list[bytes]]:
    """The entries and their bytes, every one checked: a path of the cache's, a size and hash that match."""
    header = _header(blob)
    offset = len(MAGIC) + 8 + struct.unpack_from("<Q", blob, len(MAGIC))[0]
    entries, files = header.get("entries"), []
    if not isinstance(entries, list):
        raise ValueError("kiln.load_cache_artifacts: the blob's header is damaged")
    for entry in entries:
        path, size = entry.get("path"), entry.get("size")
        if not isinstance(path, str) or not _ALLOWED.match(path) or not isinstance(size, int) or size < 0:
            raise ValueError(f"kiln.load_cache_artifacts: the blob names a file kiln does not keep: {path!r}")
        data = bytes(blob[offset:offset + size])
        offset += size
        if len(data) != size or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise ValueError(f"kiln.load_cache_artifacts: {path} is damaged (its hash does not match); nothing "
                             "was loaded")
        files.append(data)
    if offset != len(blob):
        raise ValueError("kiln.load_cache_artifacts: the blob has trailing bytes; nothing was loaded")
    return entries, files


def _publish(relative: str, data: bytes) -> None:
    *parts, name = relative.split("/")
    path = cache.folder(*parts) / name
    tmp = temp_name(path)
    cache.write_new(tmp, data)
    publish(tmp, path)


__all__ = ["save_cache_artifacts", "load_cache_artifacts"]

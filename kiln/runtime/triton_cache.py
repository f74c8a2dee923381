"""Triton's own cache entries that this process's kernels loaded: carried by kiln's cache artifacts, and checked
by a warm process to know whether anything is left to compile.

Triton keeps what it compiles in its cache folder (`triton.knobs.cache.dir`, TRITON_CACHE_DIR), one folder
(*entry*) per compile, named by the base32 of the compile's hash:

- a kernel's entry holds its metadata (`<name>.json`, whose "hash" names the entry), the binary the GPU loads
  (`<name>.cubin` on CUDA), the intermediate IR, and `__grp__<name>.json`, which lists the entry's files by
  absolute path: Triton's lookup reads that list, so a kernel is found only where its list names its folder;
- the C launcher Triton builds for each kernel signature (`__triton_launcher<EXT_SUFFIX>`, a Python extension
  compiled with the C compiler) has an entry of its own, named by the hash of its C source and the platform, as
  has the driver's own extension (`cuda_utils<EXT_SUFFIX>`, which loads binaries onto the GPU).

`record_kernel` and `record_launcher` (called where kiln loads a binary, kiln/codegen/triton/launch.py) note the
entries; `saved_files` hands them to kiln.save_cache_artifacts (a kernel's metadata and binary only: the IR is
for reading, and Triton loads a kernel from those two), and `publish` writes a blob's entries into this
machine's Triton cache: each built in a fresh private folder, its file list written for where it will live,
and renamed into place whole, so Triton sees an entry complete or not at all; an entry already there is left
as it is. An entry compiled for another GPU target, or a launcher for another platform or Python, is skipped:
it would never be looked up here.

Triton is imported only where an entry is recorded or published: kiln runs without it on the CPU.
"""
from __future__ import annotations

import base64
import json
import os
import platform
import re
import shutil
import sysconfig
import tempfile
import threading
from pathlib import Path

from kiln.runtime.private_files import unsafe_reason, write_atomic

# The file the GPU loads, by Triton's backend name (what torch's artifacts carry too).
BINARY_SUFFIX = {"cuda": "cubin", "hip": "hsaco", "xpu": "zebin"}
LAUNCHER_PREFIX = "__triton_launcher"
# The C extensions Triton compiles and keeps in its cache: a launcher per kernel signature, the driver's utilities.
EXTENSION_PREFIXES = (LAUNCHER_PREFIX, "cuda_utils", "hip_utils")
GROUP_PREFIX = "__grp__"
# An entry's name: base32 of a SHA-256, unpadded (Triton's `_base32`).
ENTRY_NAME = re.compile(r"^[A-Z2-7]{52}$")

_used: dict[str, dict] = {}  # entry name -> {"kind", "folder", "files", and "target" or "platform"}
_lock = threading.Lock()


def cache_root() -> Path:
    """Triton's cache folder in this process (TRITON_CACHE_DIR or Triton's default)."""
    import triton

    return Path(triton.knobs.cache.dir)


def platform_key() -> list[str]:
    """What a launcher extension is built for: the machine, the OS and the Python ABI (its file's suffix)."""
    return [platform.machine(), platform.system(), sysconfig.get_config_var("EXT_SUFFIX") or ""]


def record_kernel(binary) -> str | None:
    """Note the cache entry `binary` (a Triton CompiledKernel) was loaded from; its file list's path relative to
    Triton's cache folder (what `all_cached` checks), or None where the binary is not in that folder (another
    cache manager) or its backend's binary file is not known."""
    group = getattr(binary, "metadata_group", None) or {}
    target = getattr(getattr(binary, "metadata", None), "target", None)
    suffix = BINARY_SUFFIX.get(getattr(target, "backend", None))
    metadata = next((name for name in group if name.endswith(".json")), None)
    compiled = next((name for name in group if suffix and name.endswith("." + suffix)), None)
    if metadata is None or compiled is None:
        return None
    folder = Path(group[metadata]).parent
    if folder.parent != cache_root() or not ENTRY_NAME.match(folder.name):
        return None
    with _lock:
        _used.setdefault(folder.name, {"kind": "kernel", "folder": folder, "files": [metadata, compiled],
                                       "target": [target.backend, target.arch, target.warp_size]})
    return f"{folder.name}/{GROUP_PREFIX}{metadata}"


def record_launcher(run) -> None:
    """Note the cache entry of the C launcher behind `run` (a CompiledKernel's `run`: its `launch` is the
    extension's function), where it is one of Triton's cache; and, once, the driver's own extension (its
    `load_binary`), which Triton compiles the same way on a machine whose cache lacks it."""
    global _utils_recorded
    _record_extension(getattr(getattr(run, "launch", None), "__self__", None))
    if not _utils_recorded:
        _utils_recorded = True
        import triton

        try:
            utils = triton.runtime.driver.active.utils
        except Exception:  # noqa: BLE001 -- no driver (a compile-only one): nothing to carry
            return
        _record_extension(getattr(getattr(utils, "load_binary", None), "__self__", None))


_utils_recorded = False


def _record_extension(module) -> None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not Path(path).name.startswith(EXTENSION_PREFIXES):
        return
    folder = Path(path).parent
    if folder.parent != cache_root() or not ENTRY_NAME.match(folder.name):
        return
    with _lock:
        _used.setdefault(folder.name, {"kind": "launcher", "folder": folder, "files": [Path(path).name],
                                       "platform": platform_key()})


def all_cached(entries) -> bool:
    """Whether Triton's cache holds every kernel of `entries` (paths `record_kernel` returned): one file check
    each. False for None (a product that did not record them)."""
    if entries is None:
        return False
    root = cache_root()
    return all(os.path.isfile(root / entry) for entry in entries)


_key_thread: threading.Thread | None = None


def hash_triton_early() -> None:
    """Start computing, in a background thread, the key Triton gives its own installation (`triton_key`: a
    SHA-256 of its compiler's sources and of libtriton, hundreds of MB), which the first kernel lookup of every
    process waits for otherwise. Hashing and reading release the GIL: started when a GPU graph reaches the
    compiler, it runs beside the AOT stage and the kernels' import, and the lookup finds it in Triton's memo.
    Once per process; nothing where Triton has no such function."""
    global _key_thread
    with _lock:
        if _key_thread is not None:
            return
        try:
            import triton
        except ImportError:
            return
        triton_key = getattr(getattr(triton.runtime, "cache", None), "triton_key", None)
        if triton_key is None:
            return
        _key_thread = threading.Thread(target=_quietly, args=(triton_key,), name="kiln-triton-key", daemon=True)
        _key_thread.start()


def hashed_triton() -> None:
    """Wait for Triton's key of its installation (started now if it was not): before threads that each look a
    kernel up start. Triton memoizes it without a lock, so threads that miss the memo together each compute it
    (a precompile pool of 32 threads hashed Triton 32 times over, and a hashing thread left running held the GIL
    into the model's first steps)."""
    hash_triton_early()
    thread = _key_thread
    if thread is not None:
        thread.join()


def _quietly(fn) -> None:
    """Call `fn`; an error is Triton's to raise again where it needs the value."""
    try:
        fn()
    except Exception:  # noqa: BLE001 -- the lookup computes it again and raises there
        pass


# ----------------------------------------------------------------------------- artifacts


def saved_files() -> tuple[dict, list[tuple[str, Path]]]:
    """(the blob header's description of the entries this process loaded: Triton's version and each entry's kind
    and target; [(path in the blob, file)])."""
    with _lock:
        used = dict(_used)
    if not used:
        return {}, []
    import triton

    described, files = {}, []
    for entry, info in sorted(used.items()):
        described[entry] = {k: v for k, v in info.items() if k not in ("folder", "files")}
        files += [(f"triton-cache/{entry}/{name}", info["folder"] / name) for name in info["files"]]
    return {"version": triton.__version__, "entries": described}, files


def publish(header: dict, files: dict[str, dict[str, bytes]]) -> dict[str, int]:
    """Write the entries of a blob (`header`: what `saved_files` described, `files`: entry -> file name -> bytes,
    all checked by `check`) into Triton's cache; how many were written, skipped, or there already."""
    counts: dict[str, int] = {}

    def count(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    here = _here(header["version"])
    if isinstance(here, str):
        for _ in files:
            count(f"triton-cache skipped ({here})")
        return counts
    root, target = here
    for entry, named in files.items():
        info = header["entries"][entry]
        if info["kind"] == "kernel" and info["target"] != target:
            count("triton-cache skipped (built for another GPU)")
        elif info["kind"] == "launcher" and info["platform"] != platform_key():
            count("triton-cache skipped (built for another platform)")
        elif _place(root, entry, named, info):
            count("triton-cache")
        else:
            count("triton-cache (already there)")
    return counts


def check(header, files: dict[str, dict[str, bytes]]) -> None:
    """ValueError unless every entry of the blob is described, well formed and what it says it is: a kernel's
    metadata names its entry (Triton's hash) and the target it was described with, a launcher is one file."""
    described = header.get("entries") if isinstance(header, dict) else None
    if not isinstance(described, dict) or set(files) - set(described) or not isinstance(header.get("version"), str):
        raise ValueError("kiln.load_cache_artifacts: the blob's Triton entries are not described")
    for entry, named in files.items():
        info = described[entry]
        kind = info.get("kind") if isinstance(info, dict) else None
        if kind == "kernel":
            _check_kernel(entry, named, info)
        elif kind != "launcher" or not isinstance(info.get("platform"), list) or len(named) != 1 \
                or not next(iter(named)).startswith(EXTENSION_PREFIXES):
            raise ValueError(f"kiln.load_cache_artifacts: the Triton entry {entry} is not one kiln carries")


def _check_kernel(entry: str, named: dict[str, bytes], info: dict) -> None:
    metadata = [name for name in named if name.endswith(".json")]
    suffix = BINARY_SUFFIX.get(info.get("target", [None])[0] if isinstance(info.get("target"), list) else None)
    if len(metadata) != 1 or not suffix or not any(name.endswith("." + suffix) for name in named):
        raise ValueError(f"kiln.load_cache_artifacts: the Triton kernel {entry} lacks its metadata or binary")
    try:
        meta = json.loads(named[metadata[0]])
        target = meta["target"]
        ok = _base32(meta["hash"]) == entry and [target["backend"], target["arch"], target["warp_size"]] == \
            info["target"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"kiln.load_cache_artifacts: the Triton kernel {entry} has unreadable metadata") from e
    if not ok:
        raise ValueError(f"kiln.load_cache_artifacts: the Triton kernel {entry} is not the kernel its metadata "
                         "describes (another hash or target)")


def _base32(hex_hash: str) -> str:
    """Triton's name of the entry of a compile whose hash is `hex_hash`."""
    return base64.b32encode(bytes.fromhex(hex_hash)).decode().rstrip("=")


def _here(triton_version: str) -> tuple[Path, list] | str:
    """(Triton's cache folder, this process's GPU target), or why the blob's entries cannot be used here."""
    try:
        import triton
    except ImportError:
        return "no Triton here"
    if triton_version != triton.__version__:
        return "built by another Triton"
    try:
        t = triton.runtime.driver.active.get_current_target()
        target = [t.backend, t.arch, t.warp_size]
    except Exception:  # noqa: BLE001 -- no GPU or driver here: only a launcher could be used, and not without one
        return "no GPU here"
    root = cache_root()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        return f"Triton's cache folder cannot be created: {e.strerror}"
    reason = unsafe_reason(os.lstat(root), is_dir=True)
    return f"Triton's cache folder {reason}" if reason else (root, target)


def _place(root: Path, entry: str, named: dict[str, bytes], info: dict) -> bool:
    """Publish one entry: built in a fresh private folder, renamed into place whole. False where Triton's cache
    has it already (a lookup leaves an empty folder, which the rename replaces)."""
    final = root / entry
    if final.is_dir() and any(final.iterdir()):
        return False
    work = Path(tempfile.mkdtemp(prefix=f"tmp.kiln_{os.getpid()}_", dir=root))
    try:
        for name, data in named.items():
            write_atomic(work / name, data)
        if info["kind"] == "kernel":  # Triton's file list, naming the files where they will be
            metadata = next(name for name in named if name.endswith(".json"))
            write_atomic(work / f"{GROUP_PREFIX}{metadata}",
                         json.dumps({"child_paths": {name: str(final / name) for name in named}}))
        try:
            os.replace(work, final)
        except OSError:  # another process published it meanwhile
            return False
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["record_kernel", "record_launcher", "all_cached", "saved_files", "publish", "check", "cache_root"]

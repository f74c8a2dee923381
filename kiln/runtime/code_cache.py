"""Python code that kiln generates, compiled once: its code objects kept in the compile cache, as Python keeps .pyc.

A warm process takes every compiled product from the cache, but still runs what it generates as Python source:
each graph's wrapper (the host program: thousands of lines for a transformer's backward) and each capture's guard
function, and CPython's `compile` of that source is a visible part of its start. The code object depends only on
the source text, the file name it is compiled under and the Python that compiles it. It is kept under the SHA-256
of the source and the Python (`code/<key[:2]>/<key>.marshal`, in `marshal`'s format, which CPython's own .pyc
files hold), with a manifest like every cache file (kiln/runtime/private_files.py). A later process that
generates the same source loads the code object instead of compiling it, and names it as its own compile would
(the file name is not in the key: a wrapper's names its graph, `<kiln wrapper graph3/forward>`, which depends on
the order graphs compile in). What runs is exactly what compiling the source would have made: the key is the
source. A file that does not match its manifest or does not read back as a code object is removed and the source
compiled again (one log line).

Only where the compile cache is on (`kiln.config.graph_cache`): the guard function of every capture would
otherwise fill the cache of a process that asked for none.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import marshal
import sys
import types
from pathlib import Path

from kiln.config import config
from kiln.runtime import cache

log = logging.getLogger("kiln.runtime.cache")

FOLDER = "code"
stats = {"hits": 0, "stores": 0}


def compiled(source: str, filename: str) -> types.CodeType:
    """`compile(source, filename, "exec")`, from the cache where an earlier compile kept it."""
    if not config.graph_cache:
        return compile(source, filename, "exec")
    path = _path(source)
    code = _load(path)
    if code is not None:
        stats["hits"] += 1
        return _named(code, filename)
    code = compile(source, filename, "exec")
    _store(path, code)
    return code


def _path(source: str) -> Path:
    h = hashlib.sha256()
    for part in (importlib.util.MAGIC_NUMBER, sys.version.encode(), source.encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    key = h.hexdigest()
    return cache.folder(FOLDER, key[:2]) / f"{key}.marshal"


def _named(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` and the functions' code inside it as compiled under `filename` (the name tracebacks and profiles
    show: `<kiln wrapper graph3/backward>`), which a graph compiled in another order or process was not."""
    if code.co_filename == filename:
        return code
    consts = tuple(_named(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _load(path: Path) -> types.CodeType | None:
    return cache.read_published(path, _code)


def _code(data: bytes) -> types.CodeType:
    code = marshal.loads(data)
    if not isinstance(code, types.CodeType):
        raise cache.Unusable("not a code object")
    return code


def _store(path: Path, code: types.CodeType) -> None:
    if cache.publish_new(path, marshal.dumps(code), "compiled code"):
        stats["stores"] += 1


__all__ = ["compiled", "stats", "FOLDER"]

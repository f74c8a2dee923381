"""kiln/runtime/code_cache.py: the Python kiln generates (wrappers, guard functions) is compiled once and its code
objects kept in the compile cache; a later compile of the same source loads them. Keyed by the source itself, so a
changed program misses; checked against its manifest, so a damaged file is compiled again, never run."""
from __future__ import annotations

import marshal

import pytest
import torch

import kiln
from kiln.config import config
from kiln.runtime import cache, code_cache
from kiln.runtime.private_files import publish, temp_name


def _run(source: str, filename: str = "<kiln test>") -> dict:
    namespace: dict = {}
    exec(code_cache.compiled(source, filename), namespace)
    return namespace


def _stored(fresh_cache) -> list:
    return [p for p in (fresh_cache / code_cache.FOLDER).rglob("*.marshal")]


def test_the_same_source_loads_its_code_object(fresh_cache):
    hits = code_cache.stats["hits"]
    assert _run("def f(x):\n    return x * 3\n")["f"](2) == 6
    assert code_cache.stats["hits"] == hits and len(_stored(fresh_cache)) == 1
    assert _run("def f(x):\n    return x * 3\n")["f"](2) == 6
    assert code_cache.stats["hits"] == hits + 1


def test_a_changed_source_or_file_name_misses(fresh_cache):
    assert _run("y = 1\n")["y"] == 1
    hits = code_cache.stats["hits"]
    assert _run("y = 2\n")["y"] == 2
    assert _run("y = 1\n", "<another file>")["y"] == 1
    assert code_cache.stats["hits"] == hits + 1 and len(_stored(fresh_cache)) == 2  # the file name is no key


def test_a_loaded_code_object_is_named_as_its_compile_names_it(fresh_cache):
    """A wrapper's file name names its graph, which another process may number otherwise: tracebacks and profiles
    show this compile's name, not the first compile's."""
    source = "def f():\n    raise ValueError('from the wrapper')\n"
    _run(source, "<kiln wrapper graph0/forward>")
    f = _run(source, "<kiln wrapper graph7/forward>")["f"]
    assert f.__code__.co_filename == "<kiln wrapper graph7/forward>"
    with pytest.raises(ValueError) as raised:
        f()
    assert raised.traceback[-1].path == "<kiln wrapper graph7/forward>"


@pytest.mark.parametrize("damage", ["flipped_byte", "not_code"])
def test_a_damaged_entry_is_compiled_again(fresh_cache, caplog, damage):
    source = "z = 40 + 2\n"
    _run(source)
    [path] = _stored(fresh_cache)
    if damage == "flipped_byte":  # the manifest no longer matches
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:  # a well-formed entry that is not a code object
        tmp = temp_name(path)
        cache.write_new(tmp, marshal.dumps(("z", 0)))
        publish(tmp, path)
    hits = code_cache.stats["hits"]
    assert _run(source)["z"] == 42
    assert code_cache.stats["hits"] == hits
    assert any("rebuilding" in r.getMessage() for r in caplog.records)
    assert _run(source)["z"] == 42 and code_cache.stats["hits"] == hits + 1  # healed for the next compile


def test_nothing_is_kept_with_the_compile_cache_off(fresh_cache, monkeypatch):
    monkeypatch.setattr(config, "graph_cache", False)
    assert _run("w = 5\n")["w"] == 5
    assert not (fresh_cache / code_cache.FOLDER).exists() or not _stored(fresh_cache)


def _mlp(x, w):
    return torch.nn.functional.gelu(x @ w).sum(-1)


def test_a_warm_compile_loads_its_wrappers_and_guards(fresh_cache):
    """A second compile of a training graph (as in a new process) compiles none of its Python: the forward's and
    backward's wrappers and the guard function come from the cache, and the results are eager's."""
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    kiln.compile(_mlp)(x, w).sum().backward()
    kiln.reset()
    hits = code_cache.stats["hits"]
    w2 = w.detach().clone().requires_grad_(True)
    out = kiln.compile(_mlp)(x, w2)
    out.sum().backward()
    assert code_cache.stats["hits"] - hits == 3  # two wrappers, one guard function
    expected = w.detach().clone().requires_grad_(True)
    torch.testing.assert_close(out, _mlp(x, expected))
    _mlp(x, expected).sum().backward()
    torch.testing.assert_close(w2.grad, expected.grad)


def test_artifacts_carry_the_code_objects(fresh_cache, tmp_path, monkeypatch):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    kiln.compile(_mlp)(x, w)
    blob = kiln.save_cache_artifacts()
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(cache, "_tree", cache.PrivateTree("cache"))
    written = kiln.load_cache_artifacts(blob)
    assert written.get(code_cache.FOLDER, 0) >= 2  # the wrapper and the guard function
    kiln.reset()
    hits = code_cache.stats["hits"]
    torch.testing.assert_close(kiln.compile(_mlp)(x, w), _mlp(x, w))
    assert code_cache.stats["hits"] - hits >= 2

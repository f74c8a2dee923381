"""The standard headers a kernel source starts with are precompiled once per cache (kiln/runtime/cache.py): later
builds read them precompiled, a damaged precompiled header is built again, and a compiler that cannot precompile
them builds the library from their text."""
from __future__ import annotations

import logging
import subprocess

import pytest

from kiln.config import compiler
from kiln.runtime import cache, private_files
from kiln.runtime.private_files import verify
from support.cache import answer, fake_compiler

HEADERS = "// a kernel's prelude\n#include <cmath>\n\n#include <algorithm>\n"


def kernel_source(value: int) -> str:
    """A library that includes what kernel sources include and whose `kiln_answer()` returns the square root of
    `value` (a square), computed through those headers."""
    return HEADERS + f'extern "C" long kiln_answer(void) {{ return std::max(std::lround(std::sqrt({value}.)), 0L); }}\n'


def precompiled(root) -> list:
    return sorted((root / "pch").rglob("*.gch"))


def test_leading_includes_are_the_includes_before_the_first_code():
    assert cache.leading_includes(HEADERS + "int x;\n#include <vector>\n") == "#include <cmath>\n#include <algorithm>\n"
    assert cache.leading_includes('extern "C" long f(void) { return 1; }\n') == ""


def test_the_headers_are_precompiled_once_and_read_precompiled_by_later_builds(fresh_cache):
    headers = cache.stats["headers"]
    assert answer(cache.load(kernel_source(49))) == 7
    assert answer(cache.load(kernel_source(81))) == 9
    assert cache.stats["headers"] == headers + 1 and len(precompiled(fresh_cache)) == 1
    flags = cache.precompiled_headers(kernel_source(4))
    # -H lists the headers the compiler reads; "!" marks a precompiled header it used
    shown = subprocess.run([compiler(), *[f for f in cache.CXX_FLAGS if f != "-shared"], *flags, "-H",
                            "-fsyntax-only", "-x", "c++", "-"], input=kernel_source(4), capture_output=True,
                           text=True, check=True).stderr
    assert f"! {precompiled(fresh_cache)[0]}" in shown.splitlines()


def test_later_builds_check_the_precompiled_header_against_its_manifest_once(fresh_cache, monkeypatch):
    """The check reads the precompiled form whole (tens of megabytes): a process reads it for the first build that
    uses it, and again only once the file was replaced or written (the damage test below: built again)."""
    assert answer(cache.load(kernel_source(49))) == 7
    (gch,) = precompiled(fresh_cache)
    read, digest = [], private_files.file_digest
    monkeypatch.setattr(private_files, "file_digest", lambda path: read.append(path) or digest(path))
    assert answer(cache.load(kernel_source(64))) == 8
    assert answer(cache.load(kernel_source(81))) == 9
    assert read.count(gch) == 1, read


def test_a_source_without_includes_builds_without_precompiled_headers(fresh_cache):
    assert cache.precompiled_headers('extern "C" long kiln_answer(void) { return 5; }\n') == []
    assert precompiled(fresh_cache) == []


@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_damaged_precompiled_header_is_built_again(fresh_cache, monkeypatch, damage):
    assert answer(cache.load(kernel_source(16))) == 4
    (gch,) = precompiled(fresh_cache)
    data = gch.read_bytes()
    gch.write_bytes(data[:4096] if damage == "truncated" else b"#error not the header\n" + data[22:])
    headers = cache.stats["headers"]
    assert answer(cache.load(kernel_source(25))) == 5
    assert cache.stats["headers"] == headers + 1 and verify(gch) is None  # built again, matching its manifest


def test_a_compiler_that_cannot_precompile_builds_from_the_headers_text(fresh_cache, tmp_path, monkeypatch, caplog):
    script = fake_compiler(tmp_path / "bin", 'case "$*" in *c++-header*) echo "no precompiled headers" >&2; exit 1;; '
                                             'esac\nexec g++ "$@"')
    monkeypatch.setenv("KILN_CXX", str(script))
    with caplog.at_level(logging.INFO, logger="kiln.runtime.cache"):
        assert answer(cache.load(kernel_source(9))) == 3
        assert answer(cache.load(kernel_source(36))) == 6
    refused = [r for r in caplog.records if "without precompiled headers" in r.getMessage()]
    assert len(refused) == 1, "a compiler that refused once is not asked again"
    assert precompiled(fresh_cache) == []

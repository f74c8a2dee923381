"""Fixtures of the runtime tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from kiln.config import config
from kiln.runtime import cache
from kiln.runtime.private_files import PrivateTree


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache directory of this test's, with the graph cache on, and no memory of earlier refusals,
    loaded libraries or used files."""
    root = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(root))
    monkeypatch.setattr(cache, "_tree", PrivateTree("cache"))
    monkeypatch.setattr(cache, "_loaded", {})
    monkeypatch.setattr(cache, "_used", {})
    monkeypatch.setattr(config, "graph_cache", True)
    return root

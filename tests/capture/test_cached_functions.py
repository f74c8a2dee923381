"""Functions wrapped by functools.lru_cache / functools.cache, called in a compiled region.

The wrapped function is traced and the cache skipped, as torch.compile does (transformers asks
`is_torch_greater_or_equal(...)`, an lru_cache'd version check, inside forwards).
"""
from __future__ import annotations

import functools

import torch

from support.capture import check


@functools.lru_cache(maxsize=None)
def version_at_least(major: int) -> bool:
    return int(torch.__version__.split(".")[0]) >= major


@functools.cache
def scale_for(name: str) -> float:
    return {"small": 0.5, "large": 2.0}[name]


def uses_cached_helpers(x):
    if version_at_least(2):
        x = x + 1
    return x * scale_for("large") + scale_for("small")


def test_cached_functions_are_traced_in_one_graph():
    check(uses_cached_helpers, torch.randn(3), graphs=1, fullgraph=True)


def test_cache_still_works_eagerly_after_compiling():
    check(uses_cached_helpers, torch.randn(3))
    assert version_at_least.cache_info().currsize >= 1  # the eager calls filled the cache as usual


@functools.lru_cache(maxsize=None)
def scaled(x, factor):
    return x * factor


def cached_over_a_tensor(x):
    return scaled(x, 3.0) + 1  # a tensor argument: the wrapped function is traced, the cache skipped


def test_cached_function_of_a_tensor_is_traced():
    check(cached_over_a_tensor, torch.randn(3), graphs=1, fullgraph=True)

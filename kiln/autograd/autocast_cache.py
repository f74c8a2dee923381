"""Eager's autocast cast cache, reproduced in the traced joint graph.

Inside a `torch.autocast` region eager casts a float32 leaf that requires grad and is no view (a weight, an
input made with `requires_grad=True`) once: the cache hands that one cast to every op of the region that casts
the tensor again. Autograd then holds one cast node, and the gradients of the tensor's uses meet in the low
precision dtype, summed in bf16 (or fp16) before the cast's backward turns the sum into float32 (`w @ w`; a
weight read by two linears, or by every step of a loop). Traced without the cache, each use has a cast of its
own and the gradients meet in float32: a rounding of the low precision dtype away from eager's answer.

`make_fx` turns the cache off while it traces (a cached cast of a real tensor would enter the graph as an
untracked constant). The joint trace turns it back on as eager had it at the call: every tensor it can then
hold is a fake made for that trace (the primals, tensors the program creates). Eager caches no non-leaf and no
view; the primals of such inputs are leaves in the trace, so the program reads them through an alias the cache
passes by, and the aliases leave the graph once it is traced.

Which inputs eager's cache may hold is part of the variant a call runs (`variant`): only graphs that run under
autocast or enter it have one, so the others trace and key as before.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

_ALIAS = torch.ops.aten.alias.default


@dataclass(frozen=True)
class CastCache:
    """What eager's autocast cache does at a call: whether it is on (`torch.is_autocast_cache_enabled`; an
    autocast block entered without `cache_enabled` takes it), and per flat input whether it may hold it."""

    enabled: bool
    held: tuple[bool, ...]


def variant(flat: Sequence, autocast_active: bool, enters_autocast: bool) -> CastCache | None:
    """The cache part of a training call's variant; None where no autocast region meets the graph."""
    if not (autocast_active or enters_autocast):
        return None
    return CastCache(torch.is_autocast_cache_enabled(), tuple(map(_held_by_cache, flat)))


def _held_by_cache(value) -> bool:
    """Can eager's autocast cache hold this input (ATen's `cached_cast`: a float32 leaf that requires grad and
    is no view)?"""
    return (isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.requires_grad
            and value.is_leaf and not value._is_view())


@contextlib.contextmanager
def as_eager(cache: CastCache | None) -> Iterator[None]:
    """The cache on or off while the traced program runs, as eager's was at the call (make_fx turned it off)."""
    if cache is None:
        yield
        return
    before = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(cache.enabled)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(before)


def uncached_inputs(primals: Sequence, cache: CastCache | None) -> list:
    """`primals` as the traced program reads them: a float32 primal that requires grad where eager's cache would
    not hold the input (a non-leaf, a view) becomes an alias of it, which the cache does not hold either."""
    if cache is None:
        return list(primals)
    return [_ALIAS(p) if _needs_alias(p, held) else p for p, held in zip(primals, cache.held)]


def _needs_alias(primal, held: bool) -> bool:
    return not held and isinstance(primal, torch.Tensor) and primal.dtype == torch.float32 and primal.requires_grad


class LeafCopies:
    """Copies of the written inputs eager's cache holds, made leaves: the traced program writes a copy of each
    input it writes (signature.py), and a copy that is no leaf is not held by the cache, where eager's leaf written
    under no_grad still is (`zeros_(w[:, :1])` then `w @ w` under autocast: one cast, the two gradients summed in
    bf16; fuzz seed 500563). A leaf copy has no edge to its input: the joint trace takes its gradient and adds it
    to the input's (`route`), what a clone's backward would pass on."""

    def __init__(self, cache: CastCache | None):
        self.cache = cache
        self.made: dict[int, torch.Tensor] = {}

    def __call__(self, i: int, t: torch.Tensor) -> torch.Tensor:
        if self.cache is None or not self.cache.enabled or not self.cache.held[i]:
            return t.clone()
        self.made[i] = t.detach().clone().requires_grad_(t.requires_grad)
        return self.made[i]

    def route(self, grads: list, copy_grads: Sequence) -> list:
        """`grads` (one per flat input) with each leaf copy's gradient (`copy_grads`, in `made`'s order) added to
        its input's."""
        grads = list(grads)
        for i, g in zip(self.made, copy_grads):
            if g is not None:
                grads[i] = g if grads[i] is None else grads[i] + g
        return grads


def drop_aliases(gm: fx.GraphModule, primals: Sequence, cache: CastCache | None) -> None:
    """Remove the aliases `uncached_inputs` made from the traced graph: their uses read the placeholders, as a
    trace without them would. They are the graph's first aliases, one per aliased primal in order (the program
    ran after they were made)."""
    if cache is None:
        return
    count = sum(_needs_alias(p, held) for p, held in zip(primals, cache.held))
    if not count:
        return
    placeholders = set(gm.graph.find_nodes(op="placeholder"))
    aliases = list(gm.graph.find_nodes(op="call_function", target=_ALIAS))[:count]
    for node in aliases:
        if node.args[0] not in placeholders:
            raise AssertionError(f"kiln: {node.format_node()} is not an alias of a primal")
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
    gm.recompile()

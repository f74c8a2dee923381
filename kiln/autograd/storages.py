"""The storage a tensor, or an FX node's traced value, lives on: the identity the AOT stage compares to find
aliases (views of one tensor, in-place writes through them, outputs and inputs sharing memory). A `StorageWeakRef`
compares equal for one storage and keeps no tensor alive."""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef


def storage_of(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def node_storage(node) -> StorageWeakRef | None:
    """The storage of `node`'s traced value (`meta["val"]`); None for a value that is not a tensor, or an argument
    that is not a node."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return storage_of(val) if isinstance(val, torch.Tensor) else None

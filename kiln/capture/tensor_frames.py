"""Which functions called natively (after a graph break, or from a frame stepped through natively) kiln compiles.

A frame is compiled when a tensor or module is among its locals on entry (its arguments, defaults, closure cells,
the instance of a bound method); other helpers run as plain Python. torch.compile's frame hook has the same rule
and one more clause: it also compiles a frame whose code names a global bound to torch. kiln leaves that clause
out, so that such a helper answers `torch.compiler.is_compiling()` as eager does (False): code that asks from a
frame running natively (transformers' `if mask is None and not is_torchdynamo_compiling(): mask = ...`, LongT5's
encoder stack) must take eager's path, or it leaves the mask None and raises where eager does not. A helper with no
tensor to work on costs little run eagerly.
"""
from __future__ import annotations

import types
from typing import Any

import torch


def holds_torch_values(fn: types.FunctionType, args: tuple, kwargs: dict, bound_self: Any = None) -> bool:
    """Whether a frame of `fn` entered with these arguments would hold a tensor or module among its locals."""
    cells = tuple(_cell_contents(c) for c in fn.__closure__ or ())
    values = (bound_self, *args, *kwargs.values(), *(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values(),
              *cells)
    seen: set[int] = set()
    return any(_holds_tensor(v, seen) for v in values)


def _cell_contents(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name assigned later in the enclosing function)
        return None


def _holds_tensor(value: Any, seen: set[int]) -> bool:
    """A tensor or module, or a module class, itself or inside lists, tuples and dicts (named tuples by their
    fields). Other objects are not looked into, as torch.compile does not: a helper method of a plain object
    that carries tensors (a cache) runs natively unless it is handed one."""
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return True
    if isinstance(value, type):
        return issubclass(value, torch.nn.Module)
    if not isinstance(value, (list, tuple, dict)) or id(value) in seen:
        return False
    seen.add(id(value))
    items = value.values() if isinstance(value, dict) else value
    return any(_holds_tensor(v, seen) for v in items)

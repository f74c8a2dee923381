"""Symbolic sizes as plain data: how the compile cache keeps graphs whose sizes are symbols.

A graph captured with dynamic sizes holds sizes that are sympy expressions over the symbols of the capture's
shape environment (`s45`, `s45*8`), and making its product (the AOT trace, the code generator) reads more of that
environment than the graph shows: the symbols' value ranges, the guards already on them and the replacements
they imply decide what is known statically, and a trace adds guards of its own (a size it compared). So:

- a product's key describes the environment it was made in (`describe_env`: each symbol's range, the guards'
  expressions in order, the replacements, the known divisibilities), besides the graph's sizes as expressions;
- a product keeps the guards its making added (`guards_since`), and a process that loads it adds them to its own
  environment (`replay_guards`) before its capture builds the guard function from it, as the making would have;
  a guard that fails at this process's sizes (its size hints) means the product was made for other sizes: it is
  not used (`GuardsDoNotHold`) and the graph is made again;
- expressions are stored as trees of a few known sympy and torch classes (`encode_expr`), named by a table and
  rebuilt from it: nothing read back is parsed as Python or imported.

Size hints (the sizes of the call being compiled) are not in a key: what the making decides from them alone
(the partition's byte counts) is a choice of speed, not of what the code computes, and every decision that
changes results is a guard, which is checked.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import json

import sympy
import torch
import torch.utils._sympy.functions as torch_sympy

from kiln.runtime.graph_cache import Uncacheable

# The expression classes a stored tree may name: sympy's arithmetic, relations and logic, and torch's own
# integer functions (FloorDiv, ModularIndexing, Max, ...). A name outside the table is refused on both sides.
_SYMPY_CLASSES = (sympy.Add, sympy.Mul, sympy.Pow, sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge,
                  sympy.And, sympy.Or, sympy.Not)
_CLASSES: dict[str, type] = {cls.__name__: cls for cls in _SYMPY_CLASSES}
_CLASSES.update({name: cls for name, cls in vars(torch_sympy).items()
                 if inspect.isclass(cls) and issubclass(cls, sympy.Basic) and cls.__module__ == torch_sympy.__name__})


class GuardsDoNotHold(ValueError):
    """A product's guards fail at this process's sizes: it was made for sizes this call does not have."""


# ----------------------------------------------------------------------------- expressions


def encode_expr(expr) -> object:
    """`expr` as JSON: an int, true/false, {"s": name} for a symbol, {"q": [p, q]} for a rational, or
    [class name, *arguments]; Uncacheable for a class outside the table."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if expr in (sympy.true, sympy.false):
        return bool(expr)
    if isinstance(expr, sympy.Symbol):
        return {"s": expr.name}
    if isinstance(expr, sympy.Rational):
        return {"q": [int(expr.p), int(expr.q)]}
    name = type(expr).__name__
    if _CLASSES.get(name) is not type(expr):
        raise Uncacheable(f"a size expression of class {name}")
    return [name, *(encode_expr(a) for a in expr.args)]


def decode_expr(described, symbols: dict[str, sympy.Symbol]):
    """The expression `encode_expr` described, over `symbols` (name -> the environment's own symbol); ValueError
    for a symbol the environment lacks or a class outside the table."""
    if isinstance(described, bool):
        return sympy.true if described else sympy.false
    if isinstance(described, int):
        return sympy.Integer(described)
    if isinstance(described, dict) and "s" in described:
        if described["s"] not in symbols:
            raise ValueError(f"a size symbol this process does not have: {described['s']!r}")
        return symbols[described["s"]]
    if isinstance(described, dict) and "q" in described:
        return sympy.Rational(*map(int, described["q"]))
    if isinstance(described, list) and described and described[0] in _CLASSES:
        return _CLASSES[described[0]](*(decode_expr(a, symbols) for a in described[1:]))
    raise ValueError(f"not a size expression: {described!r:.80}")


# ----------------------------------------------------------------------------- values


def is_symbolic(value) -> bool:
    return isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool)


def has_static_geometry(t: torch.Tensor) -> bool:
    """No size, stride or storage offset of `t` is a symbol."""
    return not any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset()))


def encode_int(value) -> object:
    """An int, or {"symint": tree} for a SymInt; Uncacheable for a symbolic float or bool."""
    if isinstance(value, torch.SymInt):
        return {"symint": encode_expr(value.node.expr)}
    if is_symbolic(value):
        raise Uncacheable(f"a symbolic {type(value).__name__}")
    return value


def decode_int(described, shape_env):
    """The int or SymInt `encode_int` described, a SymInt of `shape_env` (its hint this process's value)."""
    if not (isinstance(described, dict) and "symint" in described):
        return described
    if shape_env is None:
        raise ValueError("a symbolic size, and no shape environment to make it in")
    expr = decode_expr(described["symint"], symbols_of(shape_env))
    if expr.is_number:
        return int(expr)
    return shape_env.create_symintnode(expr, hint=int(expr.xreplace(_hints(shape_env))))


def shape_env_of(values):
    """The shape environment of the first symbolic size among `values` (tensors and ints), or None."""
    for value in values:
        sizes = [*value.shape, *value.stride(), value.storage_offset()] if isinstance(value, torch.Tensor) \
            else [value]
        for size in sizes:
            if isinstance(size, torch.SymInt):
                return size.node.shape_env
    return None


def symbols_of(shape_env) -> dict[str, sympy.Symbol]:
    return {s.name: s for s in _hints(shape_env)}


def _hints(shape_env) -> dict:
    """Each backed symbol's value at this process's call (torch 2.13 renamed `var_to_val`)."""
    hints = getattr(shape_env, "backed_var_to_val", None)
    return hints if hints is not None else shape_env.var_to_val


# ----------------------------------------------------------------------------- the environment


def describe_env(shape_env) -> dict:
    """What of `shape_env` a product may depend on, for its key (see the module docstring): no size hints."""
    if shape_env is None:
        return {}
    ranges = {s.name: [str(r.lower), str(r.upper)] for s, r in shape_env.var_to_range.items()}
    return {"ranges": dict(sorted(ranges.items())), "guards": [str(g.expr) for g in shape_env.guards],
            "replacements": sorted([str(k), str(v)] for k, v in shape_env.replacements.items()),
            "divisible": sorted(map(str, shape_env.divisible))}


def env_digest(shape_env) -> str:
    return hashlib.sha256(json.dumps(describe_env(shape_env), sort_keys=True).encode()).hexdigest()


def guards_since(shape_env, count: int) -> list:
    """The guards added to `shape_env` after its first `count`, encoded."""
    return [encode_expr(g.expr) for g in shape_env.guards[count:]] if shape_env is not None else []


def replay_guards(shape_env, guards: list) -> None:
    """Add a product's `guards` to `shape_env`, as making it added them; GuardsDoNotHold (nothing added) if one
    fails at this process's sizes, ValueError if one does not decode."""
    if not guards:
        return
    if shape_env is None:
        raise ValueError("guards on sizes, and no shape environment to add them to")
    symbols, hints = symbols_of(shape_env), _hints(shape_env)
    exprs = [decode_expr(g, symbols) for g in guards]
    failing = next((e for e in exprs if e.xreplace(hints) is not sympy.true), None)
    if failing is not None:
        raise GuardsDoNotHold(f"the guard {failing} fails at this call's sizes")
    for expr in exprs:
        shape_env.evaluate_expr(expr)


def no_new_guards(shape_env):
    """A context in which making values with symbolic sizes adds no guard: a fake tensor rebuilt from a product
    asks things of its sizes (is it empty?) that the trace which made the product did not ask, and a guard
    added then would make this process's guards differ from those of the process that traced."""
    return shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()


__all__ = ["encode_expr", "decode_expr", "encode_int", "decode_int", "is_symbolic",
           "has_static_geometry", "shape_env_of", "symbols_of",
           "describe_env", "env_digest", "guards_since", "replay_guards", "no_new_guards", "GuardsDoNotHold"]

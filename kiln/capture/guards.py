"""Guards: what a compiled entry assumed about its inputs, checked before it runs.

Each guard has a kind (the vocabulary users see in logs and `explain`), the
source it checks, and a Python boolean expression. A cache entry's guards are
emitted as ONE Python function (`GuardSet.compile`), so a call costs one
function call, not a walk over a list. When a check fails, `GuardSet.first_failure`
re-evaluates the guards one by one to say which failed and the old vs new value.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kiln.capture.sources import AttrSource, Source


# where a source expression may start in a guard (L[...], G[...], C[...], getattr(...), a namespace name), and
# the string literals to skip (a dict-keys guard's expected keys are text, not code)
_SOURCE_START = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|(?<![\w.])(?:[LGC]\[|getattr\(|(_\w*))""")

_STR = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_KEY = rf"""\[(?:{_STR}|[^\[\]'"])*\]"""  # a subscript: a literal key (str, int, tuple) or a namespace name
_ROOT = re.compile(rf"[LGC]{_KEY}|_\w*")
_TRAILER = re.compile(rf"\.\w+|{_KEY}")
_GETATTR_TAIL = re.compile(rf", (?:{_STR})\)")


def _chain_ends(check: str, start: int) -> list[int]:
    """Where a source expression starting at `start` may end: after its root and after each trailer
    (`.name`, `[key]`), so a match always ends on a whole token."""
    if check.startswith("getattr(", start):  # getattr(<chain>, 'name'): an attribute that is not an identifier
        inner = _chain_ends(check, start + 8)
        m = _GETATTR_TAIL.match(check, inner[-1]) if inner else None
    else:
        m = _ROOT.match(check, start)
    if m is None:
        return []
    ends = [m.end()]
    while (m := _TRAILER.match(check, ends[-1])) is not None:
        ends.append(m.end())
    return ends


def _use_locals(check: str, exprs: dict[str, str]) -> str:
    """`check` with every bound source's expression replaced by its local, longest first.

    A match ends where a token ends (`L['x'].a` is not replaced inside `L['x'].ab`), and text inside
    string literals is left alone. The local holds what the expression evaluates to: it was fetched
    earlier in the same guard function, and nothing between runs user code that could change it.
    """
    out, pos = [], 0
    for m in _SOURCE_START.finditer(check):
        start = m.start()
        if check[start] in "'\"" or start < pos or (m.group(1) is not None and m.group(1) not in exprs):
            continue  # a literal, inside a replaced expression, or a namespace name no bound source starts with
        for end in reversed(_chain_ends(check, start)):
            var = exprs.get(check[start:end])
            if var is not None:
                out += (check[pos:start], var)
                pos = end
                break
    out.append(check[pos:])
    return "".join(out)


class GuardKind(enum.Enum):
    TYPE_MATCH = "type"
    ID_MATCH = "id"
    EQUALS_MATCH = "constant"
    TENSOR_MATCH = "tensor"
    LENGTH_MATCH = "length"
    DICT_KEYS = "dict keys"
    GRAD_MODE = "grad mode"
    AUTOCAST = "autocast"
    MODULE_TRAINING = "module training"
    NO_HOOKS = "module hooks"
    SHAPE = "shape relations"
    NOT_SHADOWED = "not shadowed"  # a class attribute the instance's __dict__ does not override
    HASATTR = "has attribute"  # hasattr(obj, name), or an AttributeError the code relied on


@dataclass(frozen=True)
class Guard:
    kind: GuardKind
    source: Source | None
    expr: str  # a boolean Python expression over L, G, C and the namespace
    expected: str  # the value compiled for, as the user would read it
    current: str  # an expression evaluating to the value now (for failure reasons)

    def describe(self) -> str:
        where = self.source.expr() if self.source is not None else "global state"
        return f"{self.kind.value:<16} {where}: {self.expected}"


def tensor_signature(t: torch.Tensor) -> tuple:
    """What a tensor guard compares: the properties the captured graph specialized on."""
    return (t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.requires_grad, type(t))


def describe_tensor(sig: tuple) -> str:
    dtype, device, shape, stride, requires_grad, cls = sig
    return f"{cls.__name__}(dtype={dtype}, device={device}, shape={list(shape)}, stride={list(stride)}, requires_grad={requires_grad})"


def _check_tensor(t: Any, sig: tuple) -> bool:
    return (
        type(t) is sig[5]
        and t.dtype == sig[0]
        and t.device == sig[1]
        and t.shape == sig[2]
        and t.stride() == sig[3]
        and t.requires_grad == sig[4]
    )


_is_autocast_enabled, _get_autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype


def _autocast_state() -> tuple:
    """Per device (CPU, CUDA) whether autocast is on, then its dtype (a `torch.autocast` entered
    inside the graph without a dtype takes it, so it matters even while autocast is off)."""
    return (_is_autocast_enabled("cpu"), _is_autocast_enabled("cuda"),
            _get_autocast_dtype("cpu"), _get_autocast_dtype("cuda"))


HELPERS: dict[str, Any] = {
    "___check_tensor": _check_tensor,
    "___tensor_signature": tensor_signature,
    "___describe_tensor": describe_tensor,
    "___autocast_state": _autocast_state,
    "___grad_enabled": torch.is_grad_enabled,
    "torch": torch,
}


@dataclass
class GuardSet:
    """The guards of one cache entry, deduplicated, in the order they were installed."""

    guards: list[Guard] = field(default_factory=list)
    namespace: dict[str, Any] = field(default_factory=dict)
    _seen: set = field(default_factory=set)

    def add(self, guard: Guard) -> None:
        key = (guard.kind, guard.source) if guard.source is not None else guard.expr
        if key not in self._seen:
            self._seen.add(key)
            self.guards.append(guard)

    def constant(self, value: Any, hint: str) -> str:
        """Put `value` in the guard namespace; returns the name the expressions use."""
        name = f"___{hint}_{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def source_code(self, diagnose: bool = False) -> str:
        """One function: each source is fetched once into a local, then checked; the first failure returns False.

        With `diagnose`, the same function returns the index of the failing guard instead (or the
        exception that stopped it), so a recompile reason names exactly what the real check saw.
        """
        lines = ["def guard(L, G, C):", "    try:"]
        names: dict = {}  # source -> its local
        exprs: dict = {}  # a bound source's expression (as guards write it) -> its local
        readable: dict = {}  # source -> its expression
        for i, g in enumerate(self.guards):
            if g.kind is GuardKind.NOT_SHADOWED and g.source is not None:
                self._bind(AttrSource(g.source, "__dict__"), names, lines, exprs, readable)  # reused by other guards
            elif g.source is not None:
                self._bind(g.source, names, lines, exprs, readable)
            check = _use_locals(g.expr, exprs)
            note = readable[g.source] if g.source is not None else g.expr if check != g.expr else ""
            note = f"{g.kind.value}: {note}" if note else g.kind.value  # what the locals stand for, for readers
            lines.append(f"        if not ({check}): return {i if diagnose else False}  # {note}")
        if diagnose:
            lines += ["    except Exception as e:", "        return e", "    return None"]
        else:
            lines += ["    except Exception:  # a source that no longer exists", "        return False", "    return True"]
        return "\n".join(lines)

    def _bind(self, source: Source, names: dict, lines: list[str], exprs: dict, readable: dict) -> str:
        """The local variable holding `source`'s value, fetching its base chain first (each once)."""
        if source in names:
            return names[source]
        base = getattr(source, "base", None)
        if base is None:
            expr = readable[source] = source.expr()
        else:
            expr = source.expr_from(self._bind(base, names, lines, exprs, readable))
            readable[source] = source.expr_from(readable[base], fast=False)  # = source.expr(), without the recursion
        var = f"v{len(names)}"
        names[source] = var
        exprs.setdefault(readable[source], var)
        lines.append(f"        {var} = {expr}")
        return var

    def compile(self) -> Callable:
        namespace = dict(HELPERS, **self.namespace)
        exec(compile(self.source_code(), "<kiln guards>", "exec"), namespace)
        return namespace["guard"]

    def first_failure(self, L: dict, G: dict, C: tuple) -> str | None:
        """The first guard that fails on these inputs, as 'kind source: expected X, got Y'."""
        namespace = dict(HELPERS, **self.namespace)
        exec(compile(self.source_code(diagnose=True), "<kiln guard diagnosis>", "exec"), namespace)
        failed = namespace["guard"](L, G, C)
        if isinstance(failed, Exception):
            return f"checking the guards raised {type(failed).__name__}: {failed}"
        if failed is None:
            return None
        g = self.guards[failed]
        namespace.update(L=L, G=G, C=C)
        try:
            now = eval(g.current, namespace)
        except Exception as e:  # the source itself is gone (a missing attribute, say)
            now = f"<{type(e).__name__}: {e}>"
        if not isinstance(now, str) or g.kind is GuardKind.EQUALS_MATCH:
            now = repr(now)  # as `expected` shows it: 'relu' vs 'sig', not relu vs sig
        where = g.source.expr() if g.source is not None else "global state"
        return f"{g.kind.value} guard failed on {where}: expected {g.expected}, got {now}"

    def __str__(self) -> str:
        return "\n".join(g.describe() for g in self.guards)

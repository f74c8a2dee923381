"""Guards: what a compiled entry assumed about its inputs, checked before it runs.

Each guard has a kind (the vocabulary users see in logs and `explain`), the
source it checks, and a Python boolean expression. A cache entry's guards are
emitted as ONE Python function (`GuardSet.compile`), so a call costs one
function call, not a walk over a list. When a check fails, `GuardSet.first_failure`
re-evaluates the guards one by one to say which failed and the old vs new value.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.capture import tensor_checks
from kiln.capture.sources import AttrSource, LocalSource, Source
from kiln.runtime import code_cache

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


def _bound_chains(check: str, exprs: dict[str, Any]):
    """(start, end, value) of each source expression in `check` that is a key of `exprs`, longest first.

    A match ends where a token ends (`L['x'].a` is not matched inside `L['x'].ab`), and text inside
    string literals is skipped.
    """
    pos = 0
    for m in _SOURCE_START.finditer(check):
        start = m.start()
        if check[start] in "'\"" or start < pos or (m.group(1) is not None and m.group(1) not in exprs):
            continue  # a literal, inside a matched expression, or a namespace name no key starts with
        for end in reversed(_chain_ends(check, start)):
            value = exprs.get(check[start:end])
            if value is not None:
                yield start, end, value
                pos = end
                break


def _use_locals(check: str, exprs: dict[str, str]) -> str:
    """`check` with every bound source's expression replaced by its local, longest first.

    The local holds what the expression evaluates to: it was fetched earlier in the same guard
    function, and nothing between runs user code that could change it.
    """
    out, pos = [], 0
    for start, end, var in _bound_chains(check, exprs):
        out += (check[pos:start], var)
        pos = end
    out.append(check[pos:])
    return "".join(out)


class GuardKind(enum.Enum):
    TYPE_MATCH = "type"
    # an nn.Module's class: its instances (a decoder's layers) share entries, but are never taken for one object
    # the way type-matched configs are (`_likely_same`), which would check each layer's guards inside a block
    MODULE_TYPE = "module type"
    ID_MATCH = "id"
    EQUALS_MATCH = "constant"
    TENSOR_MATCH = "tensor"
    LENGTH_MATCH = "length"
    DICT_KEYS = "dict keys"
    GRAD_MODE = "grad mode"
    AUTOCAST = "autocast"
    MATMUL_PRECISION = "matmul precision"  # TF32 for float32 matmuls: compiled templates bake it in
    BACKEND_SWITCH = "backend switch"  # a torch.backends switch traced code read or wrote (cudnn.enabled, ...)
    MODULE_TRAINING = "module training"
    NO_HOOKS = "module hooks"
    SHAPE = "shape relations"
    NOT_SHADOWED = "not shadowed"  # a class attribute the instance's __dict__ does not override
    HASATTR = "has attribute"  # hasattr(obj, name), or an AttributeError the code relied on
    INPUT_ALIASING = "input aliasing"  # which tensor inputs share storage, where the graph writes one


@dataclass(frozen=True)
class Guard:
    kind: GuardKind
    source: Source | None
    expr: str  # a boolean Python expression over L, G, C and the namespace
    expected: str  # the value compiled for, as the user would read it
    current: str  # an expression evaluating to the value now (for failure reasons)
    native: tuple | None = None  # a tensor guard the C++ check can run: (type, dtype, device, sizes, strides or
    # None for "contiguous", requires_grad), see kiln/capture/tensor_checks.py
    changed: str | None = None  # an expression naming what changed (a tensor's dtype, ...), for failure reasons

    def describe(self) -> str:
        where = self.source.expr() if self.source is not None else "global state"
        return f"{self.kind.value:<16} {where}: {self.expected}"


def tensor_signature(t: torch.Tensor) -> tuple:
    """What a tensor guard compares: the properties the captured graph specialized on."""
    return (t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.requires_grad, type(t))


def describe_tensor(sig: tuple) -> str:
    dtype, device, shape, stride, requires_grad, cls = sig
    return (f"{cls.__name__}(dtype={dtype}, device={device}, shape={list(shape)}, stride={list(stride)}, "
            f"requires_grad={requires_grad})")


TENSOR_FIELDS = ("dtype", "device", "shape", "stride", "requires_grad", "type")


def tensor_changes(expected: tuple, t: Any, dynamic: tuple = ()) -> str:
    """The fields of a tensor guard's signature that `t` no longer matches, as 'dtype changed from torch.float32
    to torch.float64': a recompile message names them instead of leaving the reader to diff two descriptions.
    Dimensions in `dynamic` are symbolic, so their sizes are not a change; the strides of a tensor contiguous
    before and after follow from its sizes, so they are not one either."""
    if not isinstance(t, torch.Tensor):
        return f"not a tensor any more ({type(t).__name__})"
    if t.is_neg():
        return "lazily negated (its memory holds the negated values: `z.conj().imag`)"
    now = list(tensor_signature(t))
    old = list(expected)
    if dynamic:
        for sig in (old, now):
            sig[2] = [n for d, n in enumerate(sig[2]) if d not in dynamic]
    if dynamic or (_contiguous_strides(old[2]) == tuple(old[3]) and t.is_contiguous()):
        old[3], now[3] = "contiguous", "contiguous" if t.is_contiguous() else "not contiguous"  # new sizes, new
        # strides: a contiguous tensor's strides follow from its sizes, so only a change of layout is news
    changes = [f"{name} changed from {_field_text(a)} to {_field_text(b)}"
               for name, a, b in zip(TENSOR_FIELDS, old, now) if a != b]
    return "; ".join(changes) or "no field changed"


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _field_text(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    return str(list(value)) if isinstance(value, tuple) else str(value)


def _check_tensor(t: Any, sig: tuple) -> bool:
    return (
        type(t) is sig[5]
        and t.dtype == sig[0]
        and t.device == sig[1]
        and not t.is_neg()
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


def same_constant(value: Any, expected: Any) -> bool:
    """`value == expected` where equal is not enough: the same types throughout, floats' signs and NaN included.

    Python's `==` holds between 1, 1.0, True and 1+0j, between 0.0 and -0.0, and never for NaN, yet a program
    captured for one of them computes with its type (`x + s[0]` is an int tensor for 1 and a float tensor for
    1.0) and its sign (`copysign`, `str`). A guard on a constant that compared with `==` alone reused that
    program for an equal value of another type. Lists and tuples (a dict's keys, a literal tuple) compare item by
    item; other leaves (classes, functions, enums used as keys) by type and `==`.
    """
    if type(value) is not type(expected):
        return False
    if type(value) in (tuple, list):
        return len(value) == len(expected) and all(map(same_constant, value, expected))
    if type(value) is frozenset:
        return _tagged(value) == _tagged(expected)
    if type(value) is float:
        return _same_float(value, expected)
    if type(value) is complex:
        return _same_float(value.real, expected.real) and _same_float(value.imag, expected.imag)
    return value == expected


def _same_float(value: float, expected: float) -> bool:
    if value != value:
        return expected != expected
    return value == expected and math.copysign(1.0, value) == math.copysign(1.0, expected)


def _tagged(value: Any) -> Any:
    """A set's items paired with their types (nested sets and tuples too), so {1} and {1.0} differ. Signs of
    zero are not compared inside a set: it holds one of 0.0 and -0.0, whichever came first."""
    if type(value) in (tuple, frozenset):
        return type(value), type(value)(map(_tagged, value))
    return type(value), value


def _equal_is_exact(value: Any) -> bool:
    """Is `==` against `value` exact, once the compared value's type is known to be `value`'s (see `same_constant`):
    ints, strings, bytes, bools, None, and floats other than zero and NaN."""
    return type(value) in (int, str, bytes, bool, type(None)) or (
        type(value) is float and value == value and value != 0.0)


def same_items(value: Any, expected: list | tuple) -> bool:
    """`same_constant` for a flat list or tuple whose items `==` compares exactly (`_equal_is_exact`): the same
    type, equal items, and each item of its expected type. One call of C-level compares, where `same_constant`
    recurses through every item in Python (a module's dict keys are dozens of strings, checked on every call)."""
    return type(value) is type(expected) and value == expected and list(map(type, value)) == list(map(type, expected))


def constant_check(expr: str, value: Any, name: str) -> str:
    """The guard expression that `expr` still holds `value` (spelled `name` in the guard's namespace or as a
    literal). `==` where it is exact, given the type guard every constant also gets (ints, strings, bytes,
    floats other than zero and NaN); `same_items` for a list or tuple of such items; a zero by its text (its sign);
    `same_constant` where equal values can differ (see there)."""
    if type(value) in (int, str, bytes) or (type(value) is float and value == value and value != 0.0):
        return f"{expr} == {name}"
    if type(value) in (list, tuple) and all(map(_equal_is_exact, value)):
        return f"___same_items({expr}, {name})"
    if type(value) is float and value == 0.0:  # a float's text tells 0.0 from -0.0 (and from NaN): one C call
        return f"str({expr}) == {str(value)!r}"
    return f"___same_constant({expr}, {name})"


HELPERS: dict[str, Any] = {
    "___same_constant": same_constant,
    "___same_items": same_items,
    "___check_tensor": _check_tensor,
    "___tensor_signature": tensor_signature,
    "___describe_tensor": describe_tensor,
    "___tensor_changes": tensor_changes,
    "___autocast_state": _autocast_state,
    "___grad_enabled": torch.is_grad_enabled,
    "___tf32_matmuls": torch._C._get_cublas_allow_tf32,
    "torch": torch,
    "math": math,  # shape relations over rounded sizes read `math.ceil(L['x'].size()[0] / 2)`
}


def input_aliasing(tensors: tuple, itemsizes: tuple) -> tuple:
    """Per tensor: the first of `tensors` on its storage, and, if others share that storage, its
    byte offset into it.

    What a graph that writes an input assumed about which inputs alias (a write through one is
    read through the others) and where. Storages are told apart by their start address, computed
    from ints (`data_ptr`, `storage_offset`), cheaper to read than the storage object; a storage
    with no bytes (a null address) aliases nothing."""
    first: dict = {}
    places = []
    for i, (t, itemsize) in enumerate(zip(tensors, itemsizes)):
        offset = t.storage_offset() * itemsize
        start = t.data_ptr() - offset
        places.append((first.setdefault(start or ("empty", i), i), offset))
    counts: dict = {}
    for j, _ in places:
        counts[j] = counts.get(j, 0) + 1
    return tuple((j, offset if counts[j] > 1 else 0) for j, offset in places)


HELPERS["___input_aliasing"] = input_aliasing


@dataclass(frozen=True)
class _Alias:
    """A source that is the same object as `target`: proven by the identity guard at index `proof`,
    or (`proof` None) only likely, and tested per call."""

    target: Source
    proof: int | None


_DROP = "drop"  # a plan step: the guard repeats one that always runs, on a source proven the same object


def _identities(guards: list[Guard], namespace: dict) -> tuple[dict, set]:
    """Sources that an ID_MATCH guard proves are an earlier source's object: `S is R` (an alias guard)
    or `S is ___obj_N` after `R is ___obj_N`. Returns {S: _Alias(R, the guard's index)}, and the sources
    pinned to a namespace object (two of them are the same object only if proven so)."""
    by_expr = {g.source.expr(): g.source for g in reversed(guards) if g.source is not None}
    first_with: dict[str, Source] = {}  # a namespace object -> the first source guarded to be it
    same, pinned = {}, set()
    for i, g in enumerate(guards):
        other = _compared_to(g, GuardKind.ID_MATCH, "{} is ")
        if other in namespace:
            pinned.add(g.source)
            target = first_with.setdefault(other, g.source)
        else:
            target = by_expr.get(other)
        if target is not None and target != g.source and g.source not in same:
            same[g.source] = _Alias(same[target].target if target in same else target, i)
    return same, pinned


def _compared_to(g: Guard, kind: GuardKind, head: str) -> str | None:
    """What a `kind` guard written `head.format(source) + X` compares its source to: X."""
    if g.kind is not kind or g.source is None:
        return None
    head = head.format(g.source.expr())
    return g.expr[len(head):] if g.expr.startswith(head) else None


def _likely_same(guards: list[Guard], namespace: dict, same: dict) -> list[tuple[Source, Source]]:
    """Pairs (S, R) that may be one object: the parents of a proven pair that read the same child
    (`a.cfg.__dict__ is b.cfg.__dict__`), and sources type-guarded to one class kept in the namespace
    (each paired with the first such source)."""
    pairs = [(s.base, a.target.base) for s, a in same.items()
             if hasattr(s, "base") and hasattr(a.target, "base")
             and dataclasses.replace(s, base=a.target.base) == a.target]
    first_of: dict[str, Source] = {}
    for g in guards:
        cls = _compared_to(g, GuardKind.TYPE_MATCH, "type({}) is ")
        if cls in namespace:
            pairs.append((g.source, first_of.setdefault(cls, g.source)))
    return pairs


def _aliases(guards: list[Guard], namespace: dict) -> dict[Source, _Alias]:
    """Every source whose guards may repeat another source's."""
    aliases, pinned = _identities(guards, namespace)
    for s, r in _likely_same(guards, namespace, dict(aliases)):
        target = aliases[r].target if r in aliases else r
        if s not in aliases and s not in pinned and s != target:
            aliases[s] = _Alias(target, None)
    return aliases


def _mapped_ancestors(source: Source | None, aliases: dict) -> list[Source]:
    """`source` and its bases that have an alias, nearest first."""
    found = []
    while source is not None:
        if source in aliases:
            found.append(source)
        source = getattr(source, "base", None)
    return found


def _repeats(kind: GuardKind, check: str, always: set) -> bool:
    """Whether `check` (rewritten onto the alias target) is one that `always` runs, or `X is X`."""
    left, sep, right = check.partition(" is ")
    return (kind, check) in always or (sep != "" and left == right)


def _plan(guards: list[Guard], aliases: dict) -> list:
    """For each guard: None (check it), `_DROP` (leave it out) or a source S (check it only when S is
    not its alias target, in one block per S).

    A guard on (a child of) an aliased source S is rewritten onto the target R; if that check is one
    that always runs (a guard with no aliased source above it), the guard says nothing new once S is R.
    Proven (an identity guard checks it): left out, the identity guard itself kept. Likely: skipped
    behind one `if S is not R` test. So 12 BERT layers sharing one config read its attributes once.
    """
    mapped = [_mapped_ancestors(s, aliases) for s in _subjects(guards)]
    always = {(g.kind, g.expr) for g, sources in zip(guards, mapped) if not sources}
    return [_step(i, g, sources, aliases, always) for i, (g, sources) in enumerate(zip(guards, mapped))]


def _step(i: int, g: Guard, mapped: list[Source], aliases: dict, always: set):
    """The plan for guard `i`: decided by its nearest aliased source (of `mapped`) whose target repeats it.

    A source's own proof is never left out on its account (a proof may be, on account of a source
    above it: what it proves follows from that source's proof, and proofs are only dropped upwards)."""
    for source in mapped:
        alias = aliases[source]
        if not _repeats(g.kind, _onto(g.expr, source, alias.target), always):
            continue
        if alias.proof is None:
            return source
        if alias.proof != i:
            return _DROP
    return None


def _subjects(guards: list[Guard]) -> list[Source | None]:
    """The source each guard checks: its own or, for one without (a hasattr guard), the one source its
    check reads (None where it reads none or several)."""
    by_expr: dict[str, Source] = {}
    seen: set = set()
    for g in guards:
        source = g.source
        while source is not None and source not in seen:
            seen.add(source)
            by_expr.setdefault(source.expr(), source)
            source = getattr(source, "base", None)
    subjects = []
    for g in guards:
        read = {s for _, _, s in _bound_chains(g.expr, by_expr)} if g.source is None else {g.source}
        subjects.append(read.pop() if len(read) == 1 else None)
    return subjects


def _onto(check: str, source: Source, target: Source) -> str:
    """`check` with `source`'s expression written as `target`'s, where it starts a source chain."""
    root = source
    while getattr(root, "base", None) is not None:
        root = root.base
    return _use_locals(check, {root.expr(): root.expr(), source.expr(): target.expr()})


def _hooks_from_dict(check: str, module: str) -> str:
    """`m._forward_hooks` read as `m.__dict__['_forward_hooks']`, where nn.Module keeps it: a module's
    class defines `__getattr__`, which makes every attribute load on it slower than a dict lookup. (One pattern
    for every module: a pattern per module, compiled per guard, took a tenth of a warm ViT's capture.)"""
    def read(m: re.Match) -> str:
        return f".__dict__[{m.group(1)!r}]" if check.endswith(module, 0, m.start()) else m.group(0)
    return _HOOK_ATTRIBUTE.sub(read, check)


_HOOK_ATTRIBUTE = re.compile(r"\.(_\w*hooks)\b")


class _Writer:
    """The body of a guard function being written: its lines, and the local bound to each source fetched."""

    def __init__(self, diagnose: bool, native: bool = False):
        self.diagnose = diagnose
        self.native = native  # tensor guards outside blocks go to one C++ check at the end
        self.lines = ["def guard(L, G, C):", "    try:"]
        self.indent = " " * 8
        self.names: dict = {}  # source -> its local
        self.exprs: dict = {}  # a bound source's expression (as guards write it) -> its local
        self.readable: dict = {}  # source -> its expression
        self.count = 0  # locals bound so far: a block's locals keep their names after it
        self.tensors: list[tuple[str, tuple]] = []  # (local, native spec) of the tensors checked at the end

    def check(self, i: int, g: Guard) -> None:
        """`if not (<g with bound locals>): return ...`, fetching its source first."""
        expr = g.expr
        if g.kind in (GuardKind.NOT_SHADOWED, GuardKind.NO_HOOKS) and g.source is not None:
            self.bind(AttrSource(g.source, "__dict__"))  # reused by other guards
            expr = _hooks_from_dict(expr, g.source.expr()) if g.kind is GuardKind.NO_HOOKS else expr
        elif g.source is not None:
            var = self.bind(g.source)
            if self.native and g.native is not None and self.indent == " " * 8:
                self.tensors.append((var, g.native))
                self.lines.append(f"{self.indent}# tensor {var}: {g.expected}, checked in C++ at the end")
                return
        check = _use_locals(expr, self.exprs)
        note = self.readable[g.source] if g.source is not None else g.expr if check != g.expr else ""
        note = f"{g.kind.value}: {note}" if note else g.kind.value  # what the locals stand for, for readers
        self.lines.append(f"{self.indent}if not ({check}): return {i if self.diagnose else False}  # {note}")

    def block(self, source: Source, target: Source, guards: list[tuple[int, Guard]]) -> None:
        """`guards` (on `source`) checked only when `source` is not `target`'s object, whose guards
        they repeat. What the block fetches is fetched again after it: the block may not have run."""
        var, target_var = self.bind(source), self.bind(target)
        self.lines.append(f"{self.indent}if {var} is not {target_var}:  # else its guards repeat "
                          f"those of {self.readable[target]}")
        saved = dict(self.names), dict(self.exprs), self.indent
        self.indent += "    "
        for i, g in guards:
            self.check(i, g)
        self.names, self.exprs, self.indent = saved

    def bind(self, source: Source) -> str:
        """The local variable holding `source`'s value, fetching its base chain first (each once)."""
        if source in self.names:
            return self.names[source]
        base = getattr(source, "base", None)
        if base is None:
            expr = self.readable[source] = source.expr()
        else:
            expr = source.expr_from(self.bind(base))
            self.readable[source] = source.expr_from(self.readable[base], fast=False)  # = source.expr(), no recursion
        var, self.count = f"v{self.count}", self.count + 1
        self.names[source] = var
        self.exprs.setdefault(self.readable[source], var)
        self.lines.append(f"{self.indent}{var} = {expr}")
        return var

    def finish(self) -> str:
        if self.tensors:
            self.lines.append(f"{self.indent}if not ___check_tensors(___tensor_specs, "
                              f"{', '.join(var for var, _ in self.tensors)}): return False  "
                              f"# tensor: {len(self.tensors)} tensors "
                              "(type, dtype, device, shape, stride, requires_grad)")
        if self.diagnose:
            self.lines += ["    except Exception as e:", "        return e", "    return None"]
        else:
            self.lines += ["    except Exception:  # a source that no longer exists", "        return False",
                           "    return True"]
        return "\n".join(self.lines)


@dataclass
class GuardSet:
    """The guards of one cache entry, deduplicated, in the order they were installed."""

    guards: list[Guard] = field(default_factory=list)
    namespace: dict[str, Any] = field(default_factory=dict)
    _seen: set = field(default_factory=set)
    _constant_names: dict = field(default_factory=dict)  # id(value) (a device: itself) -> its name in the namespace

    def add(self, guard: Guard) -> None:
        key = (guard.kind, guard.source, guard.expr) if guard.source is not None else guard.expr
        if key not in self._seen:
            self._seen.add(key)
            self.guards.append(guard)

    def local_identities(self) -> GuardSet:
        """The identity guards on the frame's own locals (`L['self'] is ___module_3`): which objects, a module
        instance above all, this entry was compiled for."""
        return GuardSet([g for g in self.guards if g.kind is GuardKind.ID_MATCH and isinstance(g.source, LocalSource)],
                        self.namespace)

    def constant(self, value: Any, hint: str) -> str:
        """Put `value` in the guard namespace; returns the name the expressions use.

        One object has one name, so the same check on two sources reads the same text (which is how
        `_plan` sees that one guard repeats another).
        """
        key = value if type(value) is torch.device else id(value)  # `t.device` is a new object per read
        name = self._constant_names.get(key)
        if name is None:
            name = self._constant_names[key] = f"___{hint}_{len(self.namespace)}"
            self.namespace[name] = value
        return name

    def source_code(self, diagnose: bool = False, native: bool = False) -> str:
        """One function: each source is fetched once into a local, then checked; the first failure returns False.

        Guards that repeat others on a source that is the same object are left out or skipped: see `_plan`.
        With `diagnose`, the same function returns the index of the failing guard instead (or the
        exception that stopped it), so a recompile reason names exactly what the real check saw.
        With `native`, the tensor guards are one call of the C++ check (`tensor_checks`) at the end.
        """
        return self._write(diagnose, native)[0]

    def _write(self, diagnose: bool, native: bool) -> tuple[str, list[tuple]]:
        """(source, the native specs of the tensors its C++ check reads, in argument order)."""
        aliases = _aliases(self.guards, self.namespace)
        plan = _plan(self.guards, aliases)
        writer = _Writer(diagnose, native)
        written: set = set()
        for i, (g, step) in enumerate(zip(self.guards, plan)):
            if step is None:
                writer.check(i, g)
            elif step is not _DROP and step not in written:
                written.add(step)
                block = [(j, self.guards[j]) for j in range(i, len(plan)) if plan[j] == step]
                writer.block(step, aliases[step].target, block)
        return writer.finish(), [spec for _, spec in writer.tensors]

    def compile(self) -> Callable:
        """The guard function, its tensor checks in C++ when the extension is loaded (`tensor_checks`)."""
        native = tensor_checks.available()
        source, specs = self._write(False, native is not None)
        namespace = dict(HELPERS, **self.namespace)
        if specs:
            namespace.update(___check_tensors=native.check, ___tensor_specs=native.specs(specs))
        exec(code_cache.compiled(source, "<kiln guards>"), namespace)
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
            now = _safe_repr(now)  # as `expected` shows it: 'relu' vs 'sig', not relu vs sig
        where = g.source.expr() if g.source is not None else "global state"
        changed = ""
        if g.changed is not None:
            try:
                changed = f"{eval(g.changed, namespace)}; "
            except Exception as e:  # the source is gone: `now` says so already
                changed = f"<{type(e).__name__}: {e}>; "
        return f"{g.kind.value} guard failed on {where}: {changed}expected {g.expected}, got {now}"

    def __str__(self) -> str:
        return "\n".join(g.describe() for g in self.guards)


def _safe_repr(value) -> str:
    """`repr(value)` for a recompile message. A user object's `__repr__` may raise (copy.copy's object made
    by `__new__` alone, before its `__init__`); the message must not turn into the user's exception."""
    try:
        return repr(value)
    except Exception as e:
        return f"<{type(value).__name__} whose repr raised {type(e).__name__}>"

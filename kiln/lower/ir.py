"""The loop-level IR: data nodes, no closures, every node printable.

A *value expression* (`Expr`) computes one element: loads from buffers at sympy
index expressions, constants, index values, and named ops. A *buffer node*
says how a whole buffer is produced:

  Pointwise(ranges, body)                    body over i0..i{n-1}
  Reduction(ranges, reduction_ranges, type, body)   body over i* and r*
  Extern(op, args, kwargs)                   an ATen call (matmul, conv, anything unlowered)
  MultiOutput(source, index)                 one element of an Extern's tuple result

Op names (`Op.name`) are target-independent; each code generator (C++, Triton)
maps them to its own syntax through a table. Index symbols: `i<k>` output
dimensions, `r<k>` reduction dimensions, size symbols (`s0`...) come from the
graph's symbolic shapes and are kernel arguments.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch.utils._pytree import tree_map

from kiln.lower.index import contiguous_strides


@dataclass(frozen=True)
class Load:
    """`buf[index]`; when `mask` is given the load happens only where it holds (else 0).

    Gather-style loads (embedding, index_select, gather) put symbols `ind<k>` in the
    index and bind each to an integer expression in `indirect` ((symbol, Expr) pairs).
    """

    buf: str
    index: sympy.Expr
    dtype: torch.dtype
    mask: Any = None
    indirect: tuple = ()

    def __hash__(self) -> int:  # computed once: expressions are dict keys (CSE, caches) all through codegen
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.buf, self.index, self.dtype, self.mask, self.indirect))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # string hashes differ between processes: a copy computes its own
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True, eq=False)
class Const:
    """A constant of the IR. Two are equal where they print the same: -0.0 and 0.0 are not (Python's == makes
    them one, and an expression cache then gave `full_like(x, -0.0)` the code of an earlier `full_like(x, 0.0)`),
    and NaN is one constant."""

    value: bool | int | float
    dtype: torch.dtype

    def _key(self) -> tuple:
        return type(self.value), repr(self.value), self.dtype

    def __eq__(self, other) -> bool:
        return isinstance(other, Const) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def converted(value, src: torch.dtype, dst: torch.dtype) -> bool | int | float:
    """`value`, a constant of `src`, converted to `dst` as eager converts a tensor of `src`: first held in `src`
    (0.1 as float32 is 0.100000001490116), then rounded to nearest-even in a half type, wrapped into a narrow
    integer type. Returns the Python scalar holding exactly the `dst` value."""
    exact = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None)
    return exact.to(src).to(dst).item()


@dataclass(frozen=True)
class IndexValue:
    """An index expression used as data (arange, masks): a sympy expression, integer or boolean."""

    expr: Any
    dtype: torch.dtype


@dataclass(frozen=True)
class Op:
    """A named elementwise op (see OP_NAMES) over argument expressions, producing `dtype`."""

    name: str
    args: tuple
    dtype: torch.dtype

    def __hash__(self) -> int:  # computed once (hashing a deep tree on every lookup is quadratic)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.name, self.args, self.dtype))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:  # string hashes differ between processes: a copy computes its own
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


Expr = Load | Const | IndexValue | Op

# Every op name a lowering may emit; each code generator maps all of them.
OP_NAMES = frozenset("""
add sub mul truediv floordiv truncdiv mod fmod neg abs sign pow
exp exp2 log log2 log10 log1p expm1 sqrt rsqrt reciprocal sigmoid tanh erf erfc lgamma
sin cos tan asin acos atan sinh cosh asinh acosh atanh atan2 floor ceil round trunc
maximum minimum eq ne lt le gt ge logical_and logical_or logical_xor logical_not
bitwise_and bitwise_or bitwise_xor bitwise_not lshift rshift
isnan isinf where cast check_index
copysign hypot nextafter digamma trigamma zeta fma
""".split())

# Invalid values a kernel finds where eager raises: error code -> (exception type, message). A kernel
# reports the codes (C++: its return value, the codes ORed; Triton: a flag tensor) and the wrapper raises
# the exception of the lowest. Each code is one bit.
ZERO_DIVISION, INDEX_OUT_OF_RANGE, GATHER_OUT_OF_BOUNDS, INDEX_OUT_OF_BOUNDS = 1, 2, 4, 8
KERNEL_ERRORS = {
    ZERO_DIVISION: (RuntimeError, "ZeroDivisionError"),  # eager's integer `//` and `%` by zero
    INDEX_OUT_OF_RANGE: (IndexError, "index out of range in self"),  # embedding, index_select
    GATHER_OUT_OF_BOUNDS: (RuntimeError, "index out of bounds in gather or scatter: an index is not in "
                                         "[0, size) of the dimension it indexes"),
    INDEX_OUT_OF_BOUNDS: (IndexError, "index out of bounds: an index is not in [-size, size) of the dimension "
                                      "it indexes"),  # advanced indexing x[i]
}
# `check_index(i, size, code)`: `i` where 0 <= i < size; otherwise the kernel reports `code` and the
# result is 0 (a valid address when size > 0; lowerings refuse an indexed dim of static size 0).
# Integer floordiv, truncdiv, mod and fmod report ZERO_DIVISION where the divisor is 0.
CHECKED_DIVISIONS = frozenset({"floordiv", "truncdiv", "mod", "fmod"})

REDUCTION_TYPES = frozenset(
    "sum prod max min any argmax argmin welford_mean welford_m2".split())


@dataclass
class Layout:
    """Size, stride and storage offset of a buffer, in elements (sympy)."""

    size: tuple
    stride: tuple
    dtype: torch.dtype
    offset: Any = 0

    @classmethod
    def contiguous(cls, size, dtype):
        size = tuple(sympy.sympify(s) for s in size)
        return cls(size, contiguous_strides(size), dtype)

    def numel(self):
        out = sympy.Integer(1)
        for s in self.size:
            out = out * s
        return out

    def __str__(self):
        dims = ", ".join(map(str, self.size))
        stride = "" if self.stride == contiguous_strides(self.size) else f" stride=({', '.join(map(str, self.stride))})"
        return f"{str(self.dtype).replace('torch.', '')}[{dims}]{stride}"


@dataclass
class Pointwise:
    ranges: tuple
    body: Expr


@dataclass
class Reduction:
    ranges: tuple
    reduction_ranges: tuple
    reduction_type: str
    body: Expr

    @property
    def family(self) -> str:
        """Reductions that share one accumulator: welford_mean and welford_m2 are one Welford pass."""
        return "welford" if self.reduction_type.startswith("welford") else self.reduction_type


@dataclass
class ComputedBuffer:
    """A buffer written by generated code, one element per point of `data.ranges`."""

    name: str
    layout: Layout
    data: Pointwise | Reduction

    def is_reduction(self) -> bool:
        return isinstance(self.data, Reduction)


@dataclass
class InputBuffer:
    name: str
    layout: Layout


@dataclass
class TensorRef:
    """A tensor argument of an Extern: a buffer, or a strided view of one."""

    buf: str
    layout: Layout
    view: bool = False


@dataclass
class SymRef:
    """A size expression passed to an Extern or returned (evaluated by the wrapper)."""

    expr: Any


@dataclass
class SizeFloatRef:
    """A float computed from sizes (`math.sqrt(n)`) passed to an Extern: the wrapper computes it as a Python float,
    as eager's program computes it, from `value`, a float64 element expression over sizes (kiln/lower/sym_floats.py)."""

    value: Any


@dataclass
class Extern:
    """An ATen call the code generator does not lower. `layouts` are the output(s) eager produces."""

    name: str
    op: Any
    args: tuple
    kwargs: dict
    layout: Any  # Layout, or a tuple of Layout/None for tuple results
    aliases_inputs: bool = False


@dataclass
class MultiOutput:
    name: str
    source: str
    index: int
    layout: Layout


Node = ComputedBuffer | Extern | MultiOutput


def extern_reads(node: Extern | MultiOutput) -> set[str]:
    """Names of the buffers an extern (or one item of its tuple result) reads."""
    if isinstance(node, MultiOutput):
        return {node.source}
    out: set[str] = set()
    _add_refs((node.args, node.kwargs), out)
    return out


def _add_refs(tree, out: set) -> None:
    """Add to `out` the buffers of the TensorRefs in `tree` (an extern's arguments: tuples, lists and dicts of
    them). A walk over those containers alone: every pass that orders or plans the nodes asks for their reads,
    and a general pytree flatten of the arguments cost more than the rest of the question."""
    if isinstance(tree, TensorRef):
        out.add(tree.buf)
    elif isinstance(tree, (tuple, list)):
        for x in tree:
            _add_refs(x, out)
    elif isinstance(tree, dict):
        for x in tree.values():
            _add_refs(x, out)


@dataclass
class LoweredGraph:
    """The whole lowered program: inputs, nodes in program order, and what it returns."""

    inputs: list          # InputBuffer | SymInput
    nodes: list           # Node, in program order
    outputs: list         # TensorRef | SymRef | Const (python constants pass through)
    size_vars: dict = field(default_factory=dict)  # sympy.Symbol -> how the wrapper binds it
    constants: dict = field(default_factory=dict)  # name -> tensor (graph attributes)
    zero_padded: dict = field(default_factory=dict)  # buffer -> logical last size (rows padded with zeros past it)
    origins: dict = field(default_factory=dict)  # buffer -> FX node names it computes (a kernel's fallback)
    # FX node names lowered as ATen externs whatever their lowering: a kernel fell back, or the value is computed
    # on the CPU in a GPU graph (kiln/lower/host_work.py); no GPU template replaces them
    through_aten: frozenset = frozenset()

    def buffer_layouts(self) -> dict:
        out = {b.name: b.layout for b in self.inputs if isinstance(b, InputBuffer)}
        out.update({k: Layout(tuple(v.shape), tuple(v.stride()), v.dtype) for k, v in self.constants.items()})
        for n in self.nodes:
            if isinstance(n, (ComputedBuffer, MultiOutput)):
                out[n.name] = n.layout
            elif isinstance(n, Extern) and isinstance(n.layout, Layout):
                out[n.name] = n.layout
        return out

    def __str__(self) -> str:
        return format_graph(self)


@dataclass
class SymInput:
    """A graph input that is a size (SymInt): binds `symbol` (or is a plain int)."""

    name: str
    expr: Any


# ----------------------------------------------------------------------------- printing


def format_expr(e: Expr) -> str:
    if isinstance(e, Load):
        m = f", mask={e.mask}" if e.mask is not None else ""
        ind = "".join(f", {s}={format_expr(x)}" for s, x in e.indirect)
        return f"load({e.buf}, {e.index}{m}{ind})"
    if isinstance(e, Const):
        return repr(e.value) if e.dtype != torch.bool else str(bool(e.value))
    if isinstance(e, IndexValue):
        return f"index({e.expr})"
    if e.name == "cast":
        return f"cast({format_expr(e.args[0])}, {str(e.dtype).replace('torch.', '')})"
    return f"{e.name}({', '.join(format_expr(a) for a in e.args)})"


def _format_ref(a) -> str:
    if isinstance(a, TensorRef):
        return a.buf if not a.view else f"view({a.buf}, {a.layout.size}, {a.layout.stride}, {a.layout.offset})"
    if isinstance(a, SymRef):
        return str(a.expr)
    if isinstance(a, SizeFloatRef):
        return format_expr(a.value)
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_format_ref(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner},)"
    return repr(a)


def format_node(n: Node) -> str:
    if isinstance(n, ComputedBuffer):
        d = n.data
        if isinstance(d, Pointwise):
            idx = ", ".join(f"i{k}" for k in range(len(d.ranges)))
            ranges = ", ".join(map(str, d.ranges))
            return f"{n.name}: {n.layout} = pointwise[{ranges}]: lambda {idx}: {format_expr(d.body)}"
        red = ", ".join(f"r{k} < {s}" for k, s in enumerate(d.reduction_ranges))
        return (f"{n.name}: {n.layout} = reduce_{d.reduction_type}[{', '.join(map(str, d.ranges))}]"
                f" over ({red}): {format_expr(d.body)}")
    if isinstance(n, Extern):
        args = ", ".join([_format_ref(a) for a in n.args] + [f"{k}={_format_ref(v)}" for k, v in n.kwargs.items()])
        lay = n.layout if isinstance(n.layout, Layout) else "(" + ", ".join(map(str, n.layout)) + ")"
        return f"{n.name}: {lay} = extern {n.op}({args})"
    return f"{n.name}: {n.layout} = {n.source}[{n.index}]"


def format_graph(g: LoweredGraph) -> str:
    lines = ["def graph(" + ", ".join(
        f"{b.name}: {b.layout}" if isinstance(b, InputBuffer) else f"{b.name}: int = {b.expr}"
        for b in g.inputs) + "):"]
    lines += ["    " + format_node(n) for n in g.nodes]
    lines.append("    return (" + ", ".join(_format_ref(o) for o in g.outputs) + ",)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- traversal


def subs_expr(e: Expr, mapping: dict, memo: dict | None = None) -> Expr:
    """Substitute index symbols in every index, mask and index value of `e`."""
    if memo is None:
        try:
            return _subs_cached(e, tuple(mapping.items()))
        except TypeError:  # an unhashable value somewhere: no cache
            memo = {}
    return _subs(e, mapping, memo)


@functools.lru_cache(maxsize=16384)
def _subs_cached(e: Expr, items: tuple) -> Expr:
    """subs_expr, remembered: the same body is mapped again and again (each kernel maps a node's body
    more than once; views of equal shapes share index expressions)."""
    return _subs(e, dict(items), {})


@functools.lru_cache(maxsize=65536)
def _xreplace(expr, items: tuple):
    return sympy.sympify(expr).xreplace(dict(items))


def _subs(e: Expr, mapping: dict, memo: dict) -> Expr:
    items = tuple(mapping.items())
    return map_indices(e, lambda index: _xreplace(index, items), memo)


def map_indices(e: Expr, fn, memo: dict | None = None) -> Expr:
    """`e` with `fn` applied to every load's index and mask and to every index value."""
    if memo is None:
        memo = {}
    key = id(e)
    if key in memo:
        return memo[key][1]
    if isinstance(e, Load):
        out = Load(e.buf, fn(e.index), e.dtype, None if e.mask is None else fn(e.mask),
                   tuple((s, map_indices(x, fn, memo)) for s, x in e.indirect))
    elif isinstance(e, IndexValue):
        out = IndexValue(fn(e.expr), e.dtype)
    elif isinstance(e, Op):
        out = Op(e.name, tuple(map_indices(a, fn, memo) for a in e.args), e.dtype)
    else:
        out = e
    memo[key] = (e, out)
    return out


def add_mask(e: Expr, cond) -> Expr:
    """AND `cond` into the mask of every load of `e` whose address depends on it (loads outside their
    tensor must not happen). A load whose index does not use `cond`'s symbols reads a valid address
    wherever its own mask holds (a row's scale read while padding the row's columns): it stays unmasked,
    as a scalar load must (Triton refuses a block mask on a scalar pointer)."""
    if cond is True or cond == sympy.true:
        return e
    if isinstance(e, Load):
        if not e.indirect and not (sympy.sympify(e.index).free_symbols & sympy.sympify(cond).free_symbols):
            return e
        return Load(e.buf, e.index, e.dtype, cond if e.mask is None else sympy.And(e.mask, cond),
                    tuple((s, add_mask(x, cond)) for s, x in e.indirect))
    if isinstance(e, Op):
        return Op(e.name, tuple(add_mask(a, cond) for a in e.args), e.dtype)
    return e


def iter_exprs(e: Expr):
    """Every sub-expression of `e` (pre-order, shared nodes visited once)."""
    seen, stack = set(), [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        if isinstance(x, Op):
            stack.extend(x.args)
        elif isinstance(x, Load):
            stack.extend(v for _, v in x.indirect)


def checks_values(op: Op) -> bool:
    """Does `op` check for a value eager raises on (an index out of range, an integer division by zero), which
    its kernel reports (`KERNEL_ERRORS`)?"""
    return op.name == "check_index" or (op.name in CHECKED_DIVISIONS and not op.args[0].dtype.is_floating_point)


def finds_invalid_values(e: Expr) -> bool:
    """Does `e` check for a value eager raises on? Such a computation must run even where nothing reads its
    result."""
    return any(isinstance(x, Op) and checks_values(x) for x in iter_exprs(e))


def index_symbols(e: Expr) -> set:
    """Every symbol the load indices, masks and index values inside `e` use."""
    out = set()
    for x in iter_exprs(e):
        if isinstance(x, Load):
            out |= sympy.sympify(x.index).free_symbols
            if x.mask is not None:
                out |= x.mask.free_symbols
        elif isinstance(x, IndexValue):
            out |= sympy.sympify(x.expr).free_symbols
    return out


def loads(e: Expr) -> list[Load]:
    return list(_loads(e))


@functools.lru_cache(maxsize=16384)
def _loads(e: Expr) -> tuple:
    """The loads of `e`, remembered: fusion asks for them for every candidate kernel of every node."""
    return tuple(x for x in iter_exprs(e) if isinstance(x, Load))


def expr_size(e: Expr) -> int:
    return sum(1 for _ in iter_exprs(e))


def replace_loads(e: Expr, bufs, replace: Callable[[Load], Expr]) -> Expr:
    """`e` with each load of a buffer in `bufs` replaced by `replace(load)` (whose gathered indices are replaced
    first); `e` itself where it loads none of them. Shared subexpressions are rebuilt once."""
    if not any(ld.buf in bufs for ld in loads(e)):
        return e
    memo: dict[int, Expr] = {}

    def walk(x: Expr) -> Expr:
        key = id(x)
        if key not in memo:
            if isinstance(x, Load):
                x_new = Load(x.buf, x.index, x.dtype, x.mask, tuple((s, walk(v)) for s, v in x.indirect))
                memo[key] = replace(x_new) if x.buf in bufs else x_new
            elif isinstance(x, Op):
                memo[key] = Op(x.name, tuple(walk(a) for a in x.args), x.dtype)
            else:
                memo[key] = x
        return memo[key]
    return walk(e)


def without_empty_reads(e: Expr, empty: frozenset) -> Expr:
    """`e` with each load of a buffer of no element (`empty`) read as 0. Any address in such a buffer is outside
    it, so a correct program discards what such a load gives (a `where` whose condition the lowering folded
    to False, the gradient of an empty slice scattered into zeros); loading it anyway read past the buffer (a
    null pointer: a segfault on the CPU, an illegal address on the GPU)."""
    return replace_loads(e, empty, lambda ld: Const(False if ld.dtype == torch.bool else 0.0
                                                    if ld.dtype.is_floating_point else 0, ld.dtype))


def rename_loads(e: Expr, names: dict) -> Expr:
    """`e` with its loads of each buffer `a` in `names` reading `names[a]` instead, at the same indices."""
    return replace_loads(e, names, lambda ld: Load(names[ld.buf], ld.index, ld.dtype, ld.mask, ld.indirect))


def rename_refs(tree, names: dict):
    """`tree` (an extern's arguments) with each TensorRef of a buffer in `names` naming `names[buf]`."""
    def rename(a):
        return TensorRef(names[a.buf], a.layout, a.view) if isinstance(a, TensorRef) and a.buf in names else a
    return tree_map(rename, tree)

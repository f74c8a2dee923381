"""The kernel printer both targets share: the walk over a fusion group's IR, one line per value.

A target's kernel (kiln/codegen/cpp/kernel.py, kiln/codegen/triton/kernel.py) subclasses
`KernelPrinter` and supplies only what differs between languages: its compute types
(`COMPUTE`), literals, index values, casts, half-precision rounding, the code of a load
and of a store, and how a value is declared. The walk is here once: the CSE lookup, the
dispatch on `Const` / `IndexValue` / `Load` / `cast` / `Op`, each op formatted from the
target's op table and rounded to bf16/fp16 after it as eager rounds, values kept in
registers between a store and a later load of the same element, and the bookkeeping of
which buffers a kernel reads and writes.

Literals (constants the target prints inline, not in a variable) are tracked by their
text in `literals`: a target may fold them (a cast of a literal is a literal) and must
make them values of the right shape where its language asks for one.
"""
from __future__ import annotations

import functools
from typing import ClassVar

import sympy
import torch

from kiln.codegen.cse import Scope
from kiln.lower import ir
from kiln.schedule.fusion import KernelGroup

# Stored in half precision, computed in float: eager rounds every op's result to the half type.
HALF_DTYPES = (torch.bfloat16, torch.float16)
# Ops whose result in a half type is exact (no rounding after computing in float).
# (neg and abs round too: eager's scalar loop computes them through float, which makes a bf16 NaN 0x7fc0)
EXACT_IN_HALF = {"where", "maximum", "minimum", "sign"}
# Reductions whose result in a half type is one of its inputs: the others accumulate in float and round once.
EXACT_REDUCTIONS = {"max", "min", "argmax", "argmin", "any"}

# Index expressions repeat across kernels (equal shapes, equal views): expand each once.
expand = functools.lru_cache(maxsize=65536)(sympy.expand)


class KernelPrinter:
    """One kernel's source, printed line by line from a KernelGroup (see the module docstring)."""

    INDENT: ClassVar[str] = "    "   # one level of the target's indentation
    COMPUTE: ClassVar[dict] = {}     # torch dtype -> the target's type that values of that dtype are computed in

    def __init__(self, group: KernelGroup, layouts: dict):
        self.group = group
        self.layouts = layouts
        self.lines: list[str] = []
        self.indent = 1
        self.tmp = 0
        self.literals: set[str] = set()
        self.values: dict[str, tuple] = {}   # buffer -> (store index, variable) still in registers
        self.inputs: dict[str, None] = {}
        self.outputs: dict[str, None] = {}
        self.produced = {n.name for n in group.nodes}
        self.stored = {n.name for n in group.nodes if n.name not in group.local}
        self.generation = 0  # stores so far into inputs the kernel also reads (see `Scope.lookup`)

    # ------------------------------------------------------------------ what a target supplies
    def literal(self, value, dtype: torch.dtype) -> str:
        """The target's inline constant `value` of `dtype`'s compute type."""
        raise NotImplementedError

    def index_value(self, e: ir.IndexValue) -> str:
        """The code of an index expression used as a value (iota, positions); a literal if it is constant."""
        raise NotImplementedError

    def cast(self, x: str, src: torch.dtype, dst: torch.dtype) -> str:
        """`x`, a value of `src`'s compute type, converted to `dst`'s (rounded when `dst` is a half type)."""
        raise NotImplementedError

    def round_half(self, code: str, dtype: torch.dtype) -> str:
        """`code` (computed in float) rounded to the half type `dtype`, still in the compute type."""
        raise NotImplementedError

    def template(self, e: ir.Op, args: list) -> str:
        """The format string of op `e` (`{0}`.. its operands, `{T}` a compute type); may rewrite `args`."""
        raise NotImplementedError

    def load_code(self, e: ir.Load, index) -> str:
        """The code reading `e.buf` at `index` (indirect indices already substituted)."""
        raise NotImplementedError

    def store_code(self, node: ir.ComputedBuffer, index, var: str, dtype: torch.dtype) -> None:
        """Print the store of `var` (a value of `dtype`'s compute type) into `node`'s buffer at `index`."""
        raise NotImplementedError

    def declare(self, var: str, code: str, dtype: torch.dtype) -> str:
        """The line binding `var` to `code`, a value of `dtype`."""
        raise NotImplementedError

    # ------------------------------------------------------------------ emission helpers
    def line(self, s: str) -> None:
        self.lines.append(self.INDENT * self.indent + s)

    def new_tmp(self, prefix="tmp") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp - 1}"

    def lit(self, code: str) -> str:
        """Register `code` as a literal (see the module docstring)."""
        self.literals.add(code)
        return code

    # ------------------------------------------------------------------ the walk
    def emit(self, e: ir.Expr, scope: Scope) -> str:
        """The variable (or literal) holding `e`'s value, printing the lines computing it on first use."""
        key, hit = scope.lookup(e, self.generation)
        if hit is not None:
            return hit
        if isinstance(e, ir.Const):
            return self.lit(self.literal(e.value, e.dtype))
        if isinstance(e, ir.IndexValue):
            out = self.index_value(e)
        elif isinstance(e, ir.Load):
            out, in_register = self._load(e, scope)
            if in_register:
                scope.cache[key] = out
                return out
        elif e.name == "cast":
            out = self.cast(self.emit(e.args[0], scope), e.args[0].dtype, e.dtype)
        else:
            out = self._op(e, [self.emit(a, scope) for a in e.args])
        if out in self.literals:
            return out
        var = self.new_tmp()
        self.line(self.declare(var, out, e.dtype))
        scope.cache[key] = var
        return var

    def _op(self, e: ir.Op, args: list) -> str:
        """Op `e` over its emitted operands, from the target's op table, rounded as eager rounds half types."""
        template = self.template(e, args)
        t = self.COMPUTE[e.args[0].dtype] if e.name != "where" else self.COMPUTE[e.dtype]
        out = template.format(*args, T=t)
        if e.dtype in HALF_DTYPES and e.name not in EXACT_IN_HALF:
            out = self.round_half(out, e.dtype)
        return out

    def _load(self, e: ir.Load, scope: Scope) -> tuple[str, bool]:
        """(code of the loaded value, whether it is a variable already holding it: stored earlier in the kernel
        at the same index)."""
        index = expand(e.index)
        if e.indirect:  # gather: compute the index values first, then address with them
            index = index.xreplace({s: sympy.Symbol(self.emit(x, scope), integer=True) for s, x in e.indirect})
        known = self.values.get(e.buf)
        if known is not None and known[0] == index:
            return known[1], True
        if e.buf in self.group.local:
            raise AssertionError(f"{e.buf} is register-only but read at {index} in {self.group.name}")
        if e.buf not in self.produced or e.buf in self.group.writes_inputs:  # (a split reduction's partial kernel
            self.inputs[e.buf] = None  # reads an input that its combining kernel writes: an argument of each)
        return self.load_code(e, index), False

    def _store(self, node: ir.ComputedBuffer, var: str, dtype: torch.dtype) -> None:
        """Keep `var` as `node`'s value in registers and, if the buffer is stored, print its store."""
        if node.is_reduction() and dtype in HALF_DTYPES and node.data.reduction_type not in EXACT_REDUCTIONS:
            var = self._rounded_result(var, dtype)
        index = self.group.store_index(node)
        self.values[node.name] = (index, var)
        if node.name in self.group.writes_inputs:
            self.generation += 1
        if node.name in self.stored:
            self.outputs[node.name] = None
            self.store_code(node, index, var, dtype)

    def _rounded_result(self, acc: str, dtype: torch.dtype) -> str:
        """A half-type reduction's float accumulator rounded to `dtype`, in a variable: eager rounds a bf16 sum
        once, at its result, and the ops fused after the reduction must read that rounded value, as they would
        from the stored buffer (`sum(bf16).float()` in a backward is the gradient eager computes)."""
        var = self.new_tmp()
        self.line(self.declare(var, self.round_half(acc, dtype), dtype))
        return var

    def _mapped(self, node):
        """`node`'s body over the group's loop variables."""
        return self.group.mapped_body(node)

    def _outer_segment(self, seg, scope: Scope) -> None:
        """A segment with no reduced loops: each node's value computed and stored once per output element."""
        for node in seg.nodes:
            var = self.emit(self._mapped(node), scope)
            self._store(node, var, node.data.body.dtype)

    def _forget_values_since(self, saved: dict) -> None:
        """Drop the register values bound since `saved` was taken: those computed inside a loop do not outlive it."""
        self.values = {k: v for k, v in self.values.items() if k in saved and saved[k] == v}

    def _arguments(self) -> None:
        """The kernel's arguments once its body is printed: buffers read only, buffers written, then the
        symbolic sizes."""
        self.size_args = sorted(self.group.size_symbols(), key=str)
        self.arg_names = [b for b in self.inputs if b not in self.outputs] + list(self.outputs)

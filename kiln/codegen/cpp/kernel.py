"""One C++/OpenMP function per KernelGroup (the walk over the IR is kiln/codegen/kernel.py's).

Layout of a generated kernel:

    extern "C" void kernel0(const float* __restrict__ arg0, float* __restrict__ buf2, int64_t s0) {
      #pragma omp parallel for if(...)          // outer loops: one iteration per output row
      for (int64_t x0 = 0; x0 < s0; x0++) {
        float acc0 = 0;                          // segment 0: a reduction over the inner loops
        #pragma omp simd reduction(+:acc0)
        for (int64_t y0 = 0; y0 < 64; y0++) { ... acc0 = acc0 + tmp1; }
        #pragma omp simd                         // segment 1: pointwise over the inner loops
        for (int64_t y0 = 0; y0 < 64; y0++) { ... buf2[64*x0 + y0] = ...; }
      }
    }

With no outer loop (a full reduction) the inner loops run in parallel instead,
each thread accumulating its own partial and the partials merged in thread
order (deterministic for a given thread count). bfloat16 and float16 are computed
in float and rounded after each op, as eager does.

A column reduction (the loads contiguous along the last outer loop: a bias
gradient summing a [rows, columns] tensor over its rows, a LayerNorm weight
gradient over [batch, tokens, features], a position embedding's over the batch)
runs in tiles of COLUMN_LANES columns instead: rows outer, the tile's columns
inner and vectorized, one accumulator per column (`_column_tiles`). Row by row,
a strided inner loop reads one element per cache line and does not vectorize
(benchmarks/cpu_column_reductions.py measures both).
"""
from __future__ import annotations

import functools
import math
import re

import sympy
import torch

from kiln.codegen.cse import Scope
from kiln.codegen.index_printer import cexpr as _cexpr
from kiln.codegen.kernel import KernelPrinter, expand
from kiln.lower import ir
from kiln.lower.index import contiguous_strides, linear_index, product
from kiln.schedule.fusion import KernelGroup

# Storage and compute C++ types per dtype.
STORAGE = {torch.float32: "float", torch.float64: "double", torch.bfloat16: "uint16_t", torch.float16: "uint16_t",
           torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
           torch.uint8: "uint8_t", torch.bool: "bool"}
COMPUTE = {**STORAGE, torch.bfloat16: "float", torch.float16: "float"}
# Half types: stored as their bits, computed in float, rounded after each op as eager rounds.
# dtype -> (load: bits -> float, store: float -> bits, round: float -> float).
HALF = {torch.bfloat16: ("kiln::bf16_to_float", "kiln::float_to_bf16", "kiln::round_bf16"),
        torch.float16: ("kiln::fp16_to_float", "kiln::float_to_fp16", "kiln::round_fp16")}

# IR op name -> C++ template ({T} is the compute type of the first argument).
OPS = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "floordiv": "kiln::floordiv<{T}>({0}, {1})", "truncdiv": "kiln::truncdiv<{T}>({0}, {1})",
    "mod": "kiln::pymod<{T}>({0}, {1})", "fmod": "kiln::cfmod<{T}>({0}, {1})", "neg": "(-{0})",
    "abs": "kiln::absolute<{T}>({0})", "sign": "kiln::sign<{T}>({0})", "pow": "kiln::ipow<{T}>({0}, {1})",
    "exp": "kiln::vexp({0})", "exp2": "std::exp2({0})", "log": "kiln::vlog({0})", "log2": "std::log2({0})",
    "log10": "std::log10({0})", "log1p": "kiln::vlog1p({0})", "expm1": "kiln::vexpm1({0})",
    "sqrt": "std::sqrt({0})", "rsqrt": "({T}(1) / std::sqrt({0}))", "reciprocal": "({T}(1) / {0})",
    "sigmoid": "kiln::sigmoid<{T}>({0})", "tanh": "kiln::vtanh({0})", "erf": "kiln::verf({0})",
    "erfc": "std::erfc({0})", "lgamma": "std::lgamma({0})",
    "sin": "kiln::vsin({0})", "cos": "kiln::vcos({0})", "tan": "std::tan({0})",
    "asin": "std::asin({0})", "acos": "std::acos({0})", "atan": "std::atan({0})", "sinh": "std::sinh({0})",
    "cosh": "std::cosh({0})", "asinh": "std::asinh({0})", "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})", "atan2": "std::atan2({0}, {1})", "floor": "std::floor({0})",
    "ceil": "std::ceil({0})", "round": "std::nearbyint({0})", "trunc": "std::trunc({0})",
    "maximum": "kiln::maximum<{T}>({0}, {1})", "minimum": "kiln::minimum<{T}>({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "({0} && {1})", "logical_or": "({0} || {1})",
    "logical_xor": "({0} != {1})", "logical_not": "(!{0})", "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})", "bitwise_not": "(~{0})",
    "lshift": "({0} << {1})", "rshift": "({0} >> {1})", "isnan": "std::isnan({0})",
    "isinf": "std::isinf({0})", "where": "({0} ? {1} : {2})",
    "check_index": "kiln::check_index({0}, {1}, {2}, kiln_error)",
    "digamma": "kiln::digamma<{T}>({0})", "trigamma": "kiln::trigamma<{T}>({0})", "zeta": "kiln::zeta<{T}>({0}, {1})",
    "copysign": "kiln::copy_sign<{T}>({0}, {1})", "hypot": "std::hypot({0}, {1})", "fma": "std::fma({0}, {1}, {2})",
    "nextafter": "std::nextafter({0}, {1})",
}
assert set(OPS) | {"cast"} >= ir.OP_NAMES, ir.OP_NAMES - set(OPS)
# dtype -> ops whose NaN is eager's, not the hardware's or GCC's: a float negation flips the sign bit on the bits
# (GCC folds `x - (-y)` into `x + y`, which keeps y's NaN's sign: the prelude's negate); float32 and float64 sqrt,
# log and log2 of an operand outside their domain make +NaN (positive_nan_below_zero). Other ops keep the plain
# template. Where two NaNs meet in an add, sub or mul, IEEE 754 leaves the result's sign open and x86 returns the
# NaN of the operand the compiler put first: choosing eager's costs a compare and a select per op, 1.3 to 4.6 times
# the time of arithmetic-bound kernels (docs/numerics.md), so kiln does not.
_NEGATE = {"neg": "kiln::negate<{T}>({0})"}
_FULL_FLOAT = {**_NEGATE, "sqrt": "kiln::sqrt_as_eager<{T}>({0})", "log": "kiln::log_as_eager<{T}>({0})",
               "log2": "kiln::log2_as_eager<{T}>({0})"}
NAN_RULES = {torch.float32: _FULL_FLOAT, torch.float64: _FULL_FLOAT, torch.bfloat16: _NEGATE, torch.float16: _NEGATE}
# Integer divisions report a zero divisor through the kernel's `kiln_error` (see the prelude).
INTEGER_DIVISIONS = {name: OPS[name].replace("({0}, {1})", "({0}, {1}, kiln_error)") for name in ir.CHECKED_DIVISIONS}

# reduction type -> (accumulator declaration, update, result, merge, simd clause or None)
REDUCTIONS = {
    "sum": ("{T} {a} = 0;", "{a} = {a} + {v};", "{a}", "{a} = {a} + {b};", "+"),
    "prod": ("{T} {a} = 1;", "{a} = {a} * {v};", "{a}", "{a} = {a} * {b};", "*"),
    "max": ("{T} {a} = kiln::lowest<{T}>();", "{a} = kiln::maximum<{T}>({a}, {v});", "{a}",
            "{a} = kiln::maximum<{T}>({a}, {b});", None),
    "min": ("{T} {a} = kiln::highest<{T}>();", "{a} = kiln::minimum<{T}>({a}, {v});", "{a}",
            "{a} = kiln::minimum<{T}>({a}, {b});", None),
    "any": ("bool {a} = false;", "{a} = {a} || {v};", "{a}", "{a} = {a} || {b};", "||"),
    "argmax": ("kiln::ArgReduce<{T}, true> {a};", "{a}.update({v}, {r});", "{a}.index", "{a}.merge({b});", None),
    "argmin": ("kiln::ArgReduce<{T}, false> {a};", "{a}.update({v}, {r});", "{a}.index", "{a}.merge({b});", None),
    "welford_mean": ("kiln::Welford<{T}> {a};", "{a}.update({v});", "{a}.mean", "{a}.merge({b});", None),
    "welford_m2": ("kiln::Welford<{T}> {a};", "{a}.update({v});", "{a}.m2", "{a}.merge({b});", None),
    # serial kernels compute mean and variance in two vectorized passes (see _welford_means)
    "welford_two_pass": ("{T} {a}_m2 = 0;", "{a}_m2 = {a}_m2 + ({v} - {a}_mean) * ({v} - {a}_mean);", None, None, "+"),
}
# eager's CPU product of a half type rounds its accumulator to that type after every factor (its sum accumulates
# in float): in order, so no simd clause
ROUNDED_PRODUCT = {dtype: f"prod_{dtype}" for dtype in HALF}
for _dtype, _mode in ROUNDED_PRODUCT.items():
    REDUCTIONS[_mode] = ("{T} {a} = 1;", f"{{a}} = {HALF[_dtype][2]}({{a}} * {{v}});", "{a}",
                         f"{{a}} = {HALF[_dtype][2]}({{a}} * {{b}});", None)

# A sum of floats (float32, and the half types computed in float; a two-pass variance's sums too) that runs
# sequentially accumulates in double and is rounded to float once, at the end: a thread's partial of a full
# reduction, each column's accumulator of a column tile, a sum over several inner loops or one that does not
# vectorize. In float, one accumulator adds each element to a partial grown far larger than it, losing bits at
# every step: the error grows with the count, where eager's cascade sum keeps it near one rounding (a bias
# gradient summing 968 elements came out 30x further from the exact sum than eager's). A sum that is one
# vectorized loop of at most FLOAT_LANES_LOOP elements stays in float: its SIMD lanes each add a few hundred
# elements, and in double the loop would run at half the width (softmax and LayerNorm rows took 2x as long).
WIDER_SUM = {"float": "double"}
FLOAT_LANES_LOOP = 4096

# Elements per block of a full reduction's innermost loop (`_open_blocked_loops`): threads share the blocks out,
# and each block is one vectorized loop.
REDUCTION_BLOCK = 4096

# Below this many element-iterations a kernel runs on one thread (fork/join costs more).
PARALLEL_MIN_WORK = 32768

# Columns per tile of a column reduction (`_column_tiles`): a 64-byte line of floats per row read.
COLUMN_LANES = 16
# A column tile's accumulators start here (reductions with a plain per-lane accumulator).
LANE_INIT = {"sum": "0", "prod": "1", "max": "kiln::lowest<{T}>()", "min": "kiln::highest<{T}>()", "any": "false",
             **{mode: "1" for mode in ROUNDED_PRODUCT.values()}}

# Reductions a row's loop may run in lane tiles (`_lane_tiles`): max and min, and beside them those whose order does
# not matter beyond rounding (not a half type's product, which eager rounds factor by factor, in order).
LANE_TILED = frozenset(("max", "min", "sum", "prod", "any"))
# The updates of an accumulator in vector lanes (lane and column tiles) where they differ from REDUCTIONS': the
# branch-free forms of the NaN-keeping max and min, which vectorize (prelude.h).
LANE_UPDATES = {"max": "{a} = kiln::maximum_in_lanes<{T}>({a}, {v});",
                "min": "{a} = kiln::minimum_in_lanes<{T}>({a}, {v});"}

# Index expressions repeat across kernels (equal shapes, equal views): print each once.
cexpr = functools.lru_cache(maxsize=65536)(_cexpr)
_NAME = re.compile(r"[A-Za-z_]\w*")


def const_literal(value, dtype) -> str:
    t = COMPUTE[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        if math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return f"static_cast<{t}>({float(value)!r})"
    return f"static_cast<{t}>({int(value)}L)"


class CppKernel(KernelPrinter):
    INDENT = "  "
    COMPUTE = COMPUTE

    def __init__(self, group: KernelGroup, layouts: dict):
        super().__init__(group, layouts)
        # whether the kernel checks values (an index, an integer divisor): it then returns an error code
        self.reports_errors = False

    # ------------------------------------------------------------------ the target's pieces of the walk
    def literal(self, value, dtype) -> str:
        return const_literal(value, dtype)

    def index_value(self, e: ir.IndexValue) -> str:
        code = cexpr(e.expr)
        return code if e.dtype == torch.bool else f"static_cast<{COMPUTE[e.dtype]}>({code})"

    def round_half(self, code: str, dtype: torch.dtype) -> str:
        return f"{HALF[dtype][2]}({code})"

    def declare(self, var: str, code: str, dtype: torch.dtype) -> str:
        return f"{'auto' if dtype == torch.bool else COMPUTE[dtype]} {var} = {code};"

    def template(self, e: ir.Op, args: list) -> str:
        """The C++ template of `e`; one that may find an invalid value makes the kernel report errors."""
        if ir.checks_values(e):
            self.reports_errors = True
            if e.name in INTEGER_DIVISIONS:
                return INTEGER_DIVISIONS[e.name]
        return NAN_RULES.get(e.args[0].dtype, {}).get(e.name, OPS[e.name])

    def cast(self, x: str, src: torch.dtype, dst: torch.dtype) -> str:
        if src == dst:
            return x
        if dst == torch.bool:
            return f"({x} != 0)"
        if dst in HALF:
            return f"{HALF[dst][2]}(static_cast<float>({x}))"
        if src.is_floating_point and not dst.is_floating_point:
            return f"kiln::float_to_int<{COMPUTE[dst]}>({x})"
        return f"static_cast<{COMPUTE[dst]}>({x})"

    def load_code(self, e: ir.Load, index) -> str:
        code = f"{e.buf}[{cexpr(index)}]"
        if e.dtype in HALF:
            code = f"{HALF[e.dtype][0]}({code})"
        if e.mask is not None:
            code = f"({cexpr(e.mask)} ? {code} : {COMPUTE[e.dtype]}(0))"
        return code

    def store_code(self, node: ir.ComputedBuffer, index, var: str, dtype: torch.dtype) -> None:
        v = self.cast(var, dtype, node.layout.dtype)
        if node.layout.dtype in HALF:
            v = f"{HALF[node.layout.dtype][1]}({v})"
        self.line(f"{node.name}[{cexpr(index)}] = {v};")

    # ------------------------------------------------------------------ loops
    def _open_loops(self, sizes, variables, pragma_outer=None, pragma_inner=None) -> int:
        for k, (s, v) in enumerate(zip(sizes, variables)):
            if k == 0 and pragma_outer:
                self.line(pragma_outer)
            if k == len(sizes) - 1 and pragma_inner:
                self.line(pragma_inner)
            self.line(f"for (int64_t {v} = 0; {v} < {cexpr(s)}; {v}++) {{")
            self.indent += 1
        return len(sizes)

    def _open_blocked_loops(self, sizes, variables, pragma_shared: str, pragma_block: str | None) -> int:
        """`_open_loops` with the last loop cut into blocks of REDUCTION_BLOCK elements: the other loops and the
        blocks shared out among threads (`pragma_shared`, collapsed over them), each block one loop that
        vectorizes (`pragma_block`). A full reduction's threads otherwise add their elements one at a time."""
        opened, start, end = self._open_blocks(sizes, variables, pragma_shared)
        if pragma_block:  # no statement between the collapsed loops: older compilers want them perfectly nested
            self.line(pragma_block)
        v = variables[-1]
        self.line(f"for (int64_t {v} = {start}; {v} < {end}; {v}++) {{")
        self.indent += 1
        return opened + 1

    def _open_blocks(self, sizes, variables, pragma_shared: str) -> tuple[int, str, str]:
        """The loops of `_open_blocked_loops` but a block's own: (loops opened, the block's first index, its end)."""
        *outer, last = sizes
        *outer_vars, v = variables
        self.line(f"{pragma_shared} collapse({len(sizes)})" if outer else pragma_shared)
        for s, u in zip(outer, outer_vars):
            self.line(f"for (int64_t {u} = 0; {u} < {cexpr(s)}; {u}++) {{")
            self.indent += 1
        self.line(f"for (int64_t {v}_block = 0; {v}_block < {cexpr(last)}; {v}_block += {REDUCTION_BLOCK}) {{")
        self.indent += 1
        return len(sizes), f"{v}_block", f"std::min<int64_t>({v}_block + {REDUCTION_BLOCK}, {cexpr(last)})"

    def _close(self, n: int) -> None:
        for _ in range(n):
            self.indent -= 1
            self.line("}")

    def _work(self):
        g = self.group
        return product(g.outer) * product(g.inner)

    def _parallel_if(self) -> str | None:
        """'' (always), None (never), or an OpenMP if() clause for symbolic sizes."""
        work = sympy.expand(self._work())
        if work.is_Integer:
            return "" if int(work) >= PARALLEL_MIN_WORK else None
        return f" if({cexpr(work)} >= {PARALLEL_MIN_WORK})"

    # ------------------------------------------------------------------ the kernel
    def generate(self) -> str:
        g = self.group
        body_start = len(self.lines)
        par = self._parallel_if()
        if self._is_column_reduction():
            self._column_tiles(par)
        else:
            self._row_loops(par)
        body = self.lines[body_start:]
        self._arguments()
        params = [f"const {STORAGE[self.layouts[b].dtype]}* __restrict__ {b}"
                  for b in self.inputs if b not in self.outputs]
        params += [f"{STORAGE[self.layouts[b].dtype]}* __restrict__ {b}" for b in self.outputs]
        params += [f"const int64_t {s}" for s in self.size_args]
        self.params = params
        if self.reports_errors:
            body = ["  int64_t kiln_error = 0;"] + [_reducing_errors(line) for line in body] + ["  return kiln_error;"]
        return "\n".join([f'extern "C" {self.return_type} {g.name}({", ".join(params)}) {{'] + body + ["}"])

    @property
    def return_type(self) -> str:
        return "int64_t" if self.reports_errors else "void"

    def _row_loops(self, par) -> None:
        """The outer loops, one iteration per output row, and each segment inside them (module docstring)."""
        g = self.group
        opened = 0
        if g.outer:
            has_inner = any(s.inner for s in g.segments)
            n_outer = len(g.outer)
            if has_inner or n_outer == 1:
                collapse = f" collapse({n_outer})" if n_outer > 1 else ""
                simd = " simd" if not has_inner else ""
                outer_pragma = None if par is None else f"#pragma omp parallel for{simd}{collapse}{par}"
                inner_pragma = "#pragma omp simd" if (par is None and not has_inner) else None
            else:
                collapse = f" collapse({n_outer - 1})" if n_outer > 2 else ""
                outer_pragma = None if par is None else f"#pragma omp parallel for{collapse}{par}"
                inner_pragma = "#pragma omp simd"
            opened = self._open_loops(g.outer, g.outer_vars(), outer_pragma, inner_pragma)
        outer_scope = Scope()
        for seg in g.segments:
            if seg.inner:
                self._inner_segment(seg, outer_scope, parallel=(not g.outer and par is not None), par=par)
            else:
                self._outer_segment(seg, outer_scope)
        self._close(opened)

    def canonical_source(self) -> str:
        """The source with the function and its parameters renamed by position: kernels equal in it compute
        the same function of their arguments (a deep CNN's backward repeats most of its kernels)."""
        names = [self.group.name] + self.arg_names + [str(s) for s in self.size_args]
        rename = {n: f"_{k}" for k, n in enumerate(names)}
        return _NAME.sub(lambda m: rename.get(m.group(0), m.group(0)), self.source)

    def alias_of(self, target: CppKernel) -> str:
        """A declaration making this kernel's symbol another name of `target`'s function (same canonical source)."""
        return (f'extern "C" {target.return_type} {self.group.name}({", ".join(target.params)}) '
                f'__attribute__((alias("{target.group.name}")));')

    def _inner_segment(self, seg, outer_scope: Scope, parallel: bool, par) -> None:
        g = self.group
        accs, decls = self._reduction_accumulators(seg)
        welford = [k for k in decls if k[0] == "welford"]
        produced_here = {n.name for n in seg.nodes}
        two_pass = welford and not parallel and \
            not any(ld.buf in produced_here for k in welford for ld in ir.loads(k[1]))
        for k in welford if two_pass else ():
            accs[k] = (accs[k][0], "welford_two_pass", accs[k][2])
        simd_ops = [REDUCTIONS[accs[k][1]][4] for k in decls]
        simd_ok = all(op is not None for op in simd_ops)
        if not (simd_ok and not parallel and self._one_short_inner_loop()):
            accs = _widened(accs)
        if two_pass:
            self._welford_means(accs, welford, outer_scope)
        reduction_clause = "".join(
            f" reduction({op}:{accs[k][0]}{'_m2' if accs[k][1] == 'welford_two_pass' else ''})"
            for k, op in zip(decls, simd_ops)) if simd_ok else ""
        for k in decls:
            acc, rtype, t = accs[k]
            self.line(REDUCTIONS[rtype][0].format(T=t, a=acc))
        if parallel and decls:
            self._parallel_reduction(seg, accs, decls, par)
        elif not simd_ok and len(g.inner) == 1 and all(accs[k][1] in LANE_TILED for k in decls):
            self._lane_tiles(seg, accs, decls, outer_scope)
        else:
            inner_pragma = ("#pragma omp simd" + reduction_clause) if (simd_ok or not decls) else None
            outer_pragma = None
            if parallel:
                collapse = f" collapse({len(g.inner)})" if len(g.inner) > 1 else ""
                outer_pragma, inner_pragma = f"#pragma omp parallel for{collapse}{par}", None
            opened = self._open_loops(g.inner, g.inner_vars(), outer_pragma, inner_pragma)
            self._segment_body(seg, accs, outer_scope)
            self._close(opened)
        self._finish_reductions(seg, accs)

    def _lane_tiles(self, seg, accs, decls, outer_scope) -> None:
        """The one inner loop of a max or min (whose NaN-keeping helpers the vectorizer does not take as a
        reduction: no SIMD clause) in lane tiles (`_tiled_loop`), the lanes merged in order at the end
        (`_column_tiles` does the same across columns)."""
        (size,), (y,) = self.group.inner, self.group.inner_vars()
        themselves = {accs[k][0]: accs[k][0] for k in decls}
        lanes = self._lane_accumulators(accs, decls, themselves)
        self._tiled_loop(seg, accs, outer_scope, y, "0", cexpr(size), lanes)
        self._merge_lanes(accs, decls, lanes, themselves)

    def _lane_accumulators(self, accs, decls, names: dict) -> dict:
        """Declare COLUMN_LANES accumulators for each of `decls` (named after `names[acc]`): acc -> its array."""
        lanes = {}
        for k in decls:
            acc, rtype, t = accs[k]
            lanes[acc] = f"{names[acc]}_lanes"
            self.line(f"{t} {lanes[acc]}[{COLUMN_LANES}];")
            self.line(f"for (int64_t l = 0; l < {COLUMN_LANES}; l++) {lanes[acc]}[l] = {LANE_INIT[rtype].format(T=t)};")
        return lanes

    def _tiled_loop(self, seg, accs, scope, y: str, start: str, end: str, lanes: dict) -> None:
        """The loop of `y` from `start` to `end` in tiles of COLUMN_LANES elements, element l of a tile into lane l's
        accumulators (`lanes`: accumulator -> its array) so that the tile's loop vectorizes; the elements past the
        last whole tile go into the first lanes."""
        lane_names = {acc: f"{array}[l]" for acc, array in lanes.items()}
        self.line("{  // a scope of its own: another segment of the kernel may tile the same loop")
        self.indent += 1
        self.line(f"const int64_t {y}_tiled = {start} + ({end} - {start}) / {COLUMN_LANES} * {COLUMN_LANES};")
        self.line(f"for (int64_t {y}_tile = {start}; {y}_tile < {y}_tiled; {y}_tile += {COLUMN_LANES}) {{")
        self.indent += 1
        self.line("#pragma omp simd")
        self.line(f"for (int64_t l = 0; l < {COLUMN_LANES}; l++) {{")
        self.indent += 1
        self.line(f"const int64_t {y} = {y}_tile + l;")
        self._segment_body(seg, accs, scope, acc_names=lane_names, in_lanes=True)
        self._close(2)
        self.line(f"for (int64_t {y} = {y}_tiled; {y} < {end}; {y}++) {{")
        self.indent += 1
        self.line(f"const int64_t l = {y} - {y}_tiled;")
        self._segment_body(seg, accs, scope, acc_names=lane_names)
        self._close(2)

    def _merge_lanes(self, accs, decls, lanes: dict, into: dict) -> None:
        """Each accumulator's lanes merged, in order, into `into[acc]`."""
        for k in decls:
            acc, rtype, t = accs[k]
            merge = REDUCTIONS[rtype][3].format(a=into[acc], b=f"{lanes[acc]}[l]", T=t)
            self.line(f"for (int64_t l = 0; l < {COLUMN_LANES}; l++) {merge}")

    def _one_short_inner_loop(self) -> bool:
        """Is the reduction one loop of at most FLOAT_LANES_LOOP elements (vectorized, each lane then adds few
        enough elements that its float partial stays accurate)?"""
        inner = self.group.inner
        return len(inner) == 1 and sympy.sympify(inner[0]).is_Integer and int(inner[0]) <= FLOAT_LANES_LOOP

    def _reduction_accumulators(self, seg) -> tuple[dict, list]:
        """(reduction key -> (accumulator, reduction type, accumulator type: the compute type, see `_widened`),
        the keys in order): one accumulator per distinct (family, body), so that welford's mean and m2 of one
        input share it."""
        accs: dict = {}
        decls = []
        for node in seg.nodes:
            if not node.is_reduction():
                continue
            key = (node.data.family, self._mapped(node))
            if key not in accs:
                dtype = node.data.body.dtype
                mode = ROUNDED_PRODUCT.get(dtype, "prod") if node.data.reduction_type == "prod" \
                    else node.data.reduction_type
                accs[key] = (self.new_tmp("acc"), mode, COMPUTE[dtype])
                decls.append(key)
        return accs, decls

    def _is_column_reduction(self) -> bool:
        """One segment of plain reductions (and pointwise nodes), whose loads are mostly contiguous along the
        last outer loop and strided along the innermost reduction loop, all at indices affine in that loop's
        variable (a division or modulo of it, as a concatenation's, would run per element and row, where the
        row-by-row loop computes it once per column)."""
        g = self.group
        if not g.outer or not g.inner or len(g.segments) != 1 or not g.segments[0].inner:
            return False
        nodes = g.segments[0].nodes
        reductions = [n for n in nodes if n.is_reduction()]
        if not reductions or any(n.data.reduction_type not in LANE_INIT for n in reductions):
            return False
        x, y = g.outer_vars()[-1], g.inner_vars()[-1]
        along_columns = along_rows = 0
        for node in nodes:
            for e in ir.iter_exprs(self._mapped(node)):
                if isinstance(e, ir.IndexValue) and x in sympy.sympify(e.expr).free_symbols:
                    return False
                if not isinstance(e, ir.Load):
                    continue
                index = expand(e.index)
                step_x, step_y = index.coeff(x), index.coeff(y)
                if x in expand(index - step_x * x).free_symbols or e.mask is not None or e.indirect:
                    return False
                along_rows += step_y == 1
                along_columns += step_x == 1 and step_y != 0
        return along_columns > along_rows

    def _column_tiles(self, par) -> None:
        """A column reduction (see the module docstring): per tile of COLUMN_LANES columns, rows outer, the
        tile's columns inner and vectorized, each with its own accumulator; then each column's results."""
        g = self.group
        seg = g.segments[0]
        *outer, size = g.outer
        *outer_vars, x = g.outer_vars()
        accs, decls = self._reduction_accumulators(seg)
        accs = _widened(accs)  # each column's accumulator adds every row
        lane = {acc: f"{acc}[l]" for acc, _, _ in accs.values()}  # each column's accumulator in the tile
        if par is not None:
            self.line(f"#pragma omp parallel for{f' collapse({len(g.outer)})' if outer else ''}{par}")
        opened = self._open_loops(outer, outer_vars)
        self.line(f"for (int64_t {x}_tile = 0; {x}_tile < {cexpr(size)}; {x}_tile += {COLUMN_LANES}) {{")
        self.indent += 1
        self.line(f"const int64_t lanes = std::min<int64_t>({COLUMN_LANES}, {cexpr(size)} - {x}_tile);")
        for key in decls:
            acc, rtype, t = accs[key]
            self.line(f"{t} {acc}[{COLUMN_LANES}];")
            self.line(f"for (int64_t l = 0; l < lanes; l++) {acc}[l] = {LANE_INIT[rtype].format(T=t)};")
        rows = self._open_loops(g.inner, g.inner_vars())
        self._lane_loop(x, "#pragma omp simd")
        self._segment_body(seg, accs, Scope(), acc_names=lane, in_lanes=True)
        self._close(rows + 1)
        self._lane_loop(x, None)
        self._finish_reductions(seg, {key: (lane[acc], rtype, t) for key, (acc, rtype, t) in accs.items()})
        self._close(2 + opened)

    def _lane_loop(self, x: str, pragma: str | None) -> None:
        """Open a loop over the tile's columns, with the outer variable `x` bound to each column."""
        if pragma:
            self.line(pragma)
        self.line("for (int64_t l = 0; l < lanes; l++) {")
        self.indent += 1
        self.line(f"const int64_t {x} = {x}_tile + l;")

    def _welford_means(self, accs, keys, outer_scope) -> None:
        """First pass of mean/variance: a vectorized sum per welford body, then its mean."""
        g = self.group
        for k in keys:
            acc, _, t = accs[k]
            self.line(f"{t} {acc}_sum = 0;")
        clause = "".join(f" reduction(+:{accs[k][0]}_sum)" for k in keys)
        opened = self._open_loops(g.inner, g.inner_vars(), None, "#pragma omp simd" + clause)
        scope = Scope(outer_scope)
        for k in keys:
            acc = accs[k][0]
            self.line(f"{acc}_sum = {acc}_sum + {self.emit(k[1], scope)};")
        self._close(opened)
        n = cexpr(product(g.inner))
        for k in keys:
            acc, _, t = accs[k]
            self.line(f"const {t} {acc}_mean = {acc}_sum / static_cast<{t}>({n});")

    def _segment_body(self, seg, accs, outer_scope, acc_names=None, in_lanes: bool = False) -> None:
        """The segment's nodes inside its loops; reductions update `acc_names[acc]` (default: `acc`), with the
        vector-lane updates (LANE_UPDATES) where `in_lanes`."""
        g = self.group
        scope = Scope(outer_scope)
        ridx = cexpr(linear_index(g.inner_vars(), contiguous_strides(g.inner)))
        saved = dict(self.values)
        updated = set()
        for node in seg.nodes:
            body = self._mapped(node)
            var = self.emit(body, scope)
            if node.is_reduction():
                family = node.data.family
                acc, mode, t = accs[(family, body)]
                acc = (acc_names or {}).get(acc, acc)
                if acc not in updated:  # welford mean and m2 share one accumulator
                    update = (LANE_UPDATES.get(mode) if in_lanes else None) or REDUCTIONS[mode][1]
                    self.line(update.format(a=acc, v=var, r=ridx, T=t))
                    updated.add(acc)
            else:
                self._store(node, var, body.dtype)
        self._forget_values_since(saved)  # inner values do not outlive the loop

    def _parallel_reduction(self, seg, accs, decls, par) -> None:
        """Inner loops split over threads; each thread's partial merged in thread order."""
        g = self.group
        local = {accs[k][0]: accs[k][0] + "_t" for k in decls}
        self.line(f"#pragma omp parallel{par}")
        self.line("{")
        self.indent += 1
        for k in decls:
            acc, rtype, t = accs[k]
            self.line(REDUCTIONS[rtype][0].format(T=t, a=local[acc]))
        clauses = [REDUCTIONS[accs[k][1]][4] for k in decls]
        if all(op is not None for op in clauses):
            simd = "#pragma omp simd" + "".join(f" reduction({op}:{local[accs[k][0]]})"
                                                for k, op in zip(decls, clauses))
            opened = self._open_blocked_loops(g.inner, g.inner_vars(), "#pragma omp for schedule(static)", simd)
            self._segment_body(seg, accs, Scope(), acc_names=local)
            self._close(opened)
        elif all(accs[k][1] in LANE_TILED for k in decls):  # a max or min: each thread's blocks in lane tiles
            lanes = self._lane_accumulators(accs, decls, local)
            opened, start, end = self._open_blocks(g.inner, g.inner_vars(), "#pragma omp for schedule(static)")
            self._tiled_loop(seg, accs, Scope(), g.inner_vars()[-1], start, end, lanes)
            self._close(opened)
            self._merge_lanes(accs, decls, lanes, local)
        else:
            opened = self._open_blocked_loops(g.inner, g.inner_vars(), "#pragma omp for schedule(static)", None)
            self._segment_body(seg, accs, Scope(), acc_names=local)
            self._close(opened)
        self.line("#pragma omp for ordered schedule(static, 1)")
        self.line("for (int t = 0; t < omp_get_num_threads(); t++) {")
        self.indent += 1
        self.line("#pragma omp ordered")
        self.line("{")
        self.indent += 1
        for k in decls:
            acc, rtype, t = accs[k]
            self.line(REDUCTIONS[rtype][3].format(a=acc, b=local[acc], T=t))
        self._close(2)
        self.indent -= 1
        self.line("}")

    def _finish_reductions(self, seg, accs) -> None:
        for node in seg.nodes:
            if not node.is_reduction():
                continue
            rtype = node.data.reduction_type
            family = node.data.family
            acc, mode, t = accs[(family, self._mapped(node))]
            if mode == "welford_two_pass":
                result = f"{acc}_mean" if rtype == "welford_mean" else f"{acc}_m2"
            else:
                result = REDUCTIONS[rtype][2].format(a=acc)
            var = self.new_tmp()
            out_t = COMPUTE[node.layout.dtype if rtype in ("argmax", "argmin") else node.data.body.dtype]
            self.line(f"{out_t} {var} = {result};")
            dtype = node.layout.dtype if rtype in ("argmax", "argmin") else node.data.body.dtype
            self._store(node, var, dtype)


def _widened(accs: dict) -> dict:
    """`accs` (see `_reduction_accumulators`) with float sums accumulating in double (`WIDER_SUM`)."""
    return {key: (acc, mode, WIDER_SUM.get(t, t) if mode in ("sum", "welford_two_pass") else t)
            for key, (acc, mode, t) in accs.items()}


def _reducing_errors(line: str) -> str:
    """`line` with `kiln_error` made an OR-reduction if it opens an OpenMP parallel region: each thread
    checks into its own copy, merged at the end (no race). SIMD loops take no clause: an omp simd reduction
    keeps per-lane copies in memory, which stops the loop's invariant index loads from being hoisted; the
    vectorizer finds the OR-reduction by itself."""
    if line.strip().startswith("#pragma omp parallel"):
        return line + " reduction(|:kiln_error)"
    return line


def generate_kernel(group: KernelGroup, layouts: dict) -> CppKernel:
    k = CppKernel(group, layouts)
    k.source = k.generate()
    return k

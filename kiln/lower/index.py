"""Index arithmetic for the loop-level IR, in sympy.

Every tensor of the IR is a function of integer index variables; views are
rewrites of those index expressions. Sizes may be symbols (dynamic shapes), so
all index math is symbolic; integer division and modulo get their own sympy
functions because `floor(a / b)` is not what C++ or Triton computes on
non-negative integers and would not simplify.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Sequence
from contextvars import ContextVar

import sympy
from torch.utils._sympy import functions as torch_sympy

from kiln.size_python import size_source


class FloorDiv(sympy.Function):
    """`a // b` on non-negative integers."""

    is_integer = True
    nargs = (2,)

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if isinstance(base, sympy.Add) and divisor.is_Integer:
            whole, rest = _split_multiples(base, divisor)
            if whole != 0:
                return whole + FloorDiv(rest, divisor)
        return None

    def _eval_is_nonnegative(self):
        """Known where the operands are: a stride that divides sizes is one (views with it are plain views)."""
        return _nonnegative_quotient(*self.args)


def _split_multiples(expr, d):
    """(sum of the terms of `expr` that are integer multiples of d, divided by d; the other terms)."""
    whole, rest = sympy.Integer(0), sympy.Integer(0)
    for t in expr.args:
        c, _ = t.as_coeff_Mul()
        if c.is_Integer and int(c) % int(d) == 0:
            whole += t / d
        else:
            rest += t
    return whole, rest


class Mod(sympy.Function):
    """`a % b` on non-negative integers (named apart from sympy.Mod, which assumes reals)."""

    is_integer = True
    nargs = (2,)

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) % int(divisor))
        if isinstance(base, sympy.Add) and divisor.is_Integer:
            whole, rest = _split_multiples(base, divisor)
            if whole != 0:
                return Mod(rest, divisor)
        return None

    def _eval_is_nonnegative(self):
        return _nonnegative_quotient(*self.args)


def _nonnegative_quotient(base, divisor) -> bool | None:
    """True where `base // divisor` and `base % divisor` are known non-negative (a non-negative base, a positive
    divisor), else unknown (None)."""
    return True if base.is_nonnegative and divisor.is_positive else None


@functools.lru_cache(None)
def _var(prefix: str, n: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{n}", integer=True, nonnegative=True)


@functools.lru_cache(None)
def index_vars(prefix: str, count: int) -> tuple[sympy.Symbol, ...]:
    """Loop variables `<prefix>0..`: `i` output dims, `r` reduction dims, `x`/`y` a kernel's outer/inner loops."""
    return tuple(_var(prefix, k) for k in range(count))


def sympify(x) -> sympy.Expr:
    """A size or stride from FX (int, SymInt, sympy) as a sympy expression."""
    if isinstance(x, sympy.Basic):
        return x
    node = getattr(x, "node", None)
    if node is not None and hasattr(node, "expr"):
        expr = integer_rounding(pinned(sympy.sympify(node.expr), getattr(node, "shape_env", None),
                                       getattr(node, "hint", None)))
        sizes = _PRECOMPUTED.get()
        return expr if sizes is None else sizes.lifted(expr)
    return sympy.Integer(int(x))


def _ceil_of_division(a, b):
    return FloorDiv(a + b - 1, b)


def _round_of_division(a, b):
    """round(a / b) as Python rounds, halves to even: (2a + b) // 2b rounds halves up, and a half (2a + b a
    multiple of 2b, only for an even b) that it rounds up to an odd number goes down by one."""
    twice = 2 * a + b
    up = FloorDiv(twice, 2 * b)
    if int(b) % 2:
        return up
    return up - Mod(up, 2) * (1 - sympy.Min(Mod(twice, 2 * b), 1))


# A size computed by rounding a division (`math.ceil(n / 2)`, `math.floor(n / 3)`, `int(n / 2)`, `round(n / 3)` of a
# size): torch's sympy functions over a float quotient, which no kernel prints. With a positive integer divisor each
# is integer arithmetic (ceil(a / b) == (a + b - 1) // b; trunc is floor on sizes, which are not negative).
_ROUNDED_DIVISIONS = {torch_sympy.FloorToInt: FloorDiv, torch_sympy.CeilToInt: _ceil_of_division,
                      torch_sympy.TruncToInt: FloorDiv, torch_sympy.RoundToInt: _round_of_division}


def integer_rounding(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with each rounded division of integers by a positive integer written as a floor division."""
    def rewrite(e):
        rule = _ROUNDED_DIVISIONS.get(type(e))
        quotient = e.args[0] if e.args else None
        if rule is None or type(quotient) is not torch_sympy.IntTrueDiv:
            return None
        a, b = quotient.args
        if not (b.is_Integer and int(b) > 0 and a.is_integer):
            return None
        if rule is FloorDiv and type(e) is torch_sympy.TruncToInt and not a.is_nonnegative:
            return None
        return rule(a, b)

    if not any(type(f) in _ROUNDED_DIVISIONS for f in expr.atoms(sympy.Function)):
        return expr
    return expr.replace(lambda e: rewrite(e) is not None, rewrite)


# Functions of sizes every code generator prints (kiln/codegen/index_printer.py reads these tables); a size made
# with any other (`math.ceil(math.sqrt(n))`: CeilToInt(OpaqueUnaryFn_sqrt(ToFloat(n)))) is computed by the
# wrapper. Sizes from FX metadata carry torch's own sympy functions beside kiln's and sympy's.
FLOOR_DIVISIONS = (FloorDiv, torch_sympy.FloorDiv)
REMAINDERS = (Mod, torch_sympy.Mod, torch_sympy.PythonMod)
MAXIMA = (sympy.Max, torch_sympy.Max)
MINIMA = (sympy.Min, torch_sympy.Min)
_PRINTED_FUNCTIONS = FLOOR_DIVISIONS + REMAINDERS + MAXIMA + MINIMA


def _printed(e: sympy.Basic) -> bool:
    """Whether kernels print `e` itself (its arguments may still need lifting)."""
    if isinstance(e, sympy.Pow):
        return e.exp.is_Integer and int(e.exp) > 0
    if type(e) is torch_sympy.PowByNatural:
        return e.args[1].is_Integer and int(e.args[1]) > 0
    return not isinstance(e, sympy.Function) or isinstance(e, _PRINTED_FUNCTIONS)


class PrecomputedSizes:
    """The sizes of one graph that the wrapper computes before its kernels: each maximal part of a size
    expression that no kernel prints becomes a symbol `ps<k>`, computed in Python from the input symbols (eager's
    program computed it in Python too, from the same ints), or read off an input of that size where there is
    one (a backward graph may not see the symbols the formula reads). Kernels then take it as one more size
    argument (as Inductor's precomputed sizes)."""

    def __init__(self):
        self.symbols: dict[sympy.Expr, sympy.Symbol] = {}
        self.formulas: dict[sympy.Symbol, sympy.Expr] = {}

    def bound(self, size_vars: dict) -> set:
        """The symbols that `size_vars` (the inputs' sizes) binds, with each formula over them."""
        known = set(size_vars)
        return known | {sym for sym, e in self.formulas.items() if e.free_symbols <= known}

    def bind_formulas(self, size_vars: dict) -> None:
        """Bind each symbol no input's size binds to its formula, after the input symbols it reads."""
        for sym, expr in self.formulas.items():
            if sym not in size_vars and expr.free_symbols <= size_vars.keys():
                size_vars[sym] = size_source(expr)  # the wrapper's namespace has SIZE_NAMES

    def lifted(self, expr: sympy.Expr) -> sympy.Expr:
        """`expr` with each maximal part no kernel prints replaced by its symbol."""
        if _printed(expr):
            if not expr.args:
                return expr
            args = [self.lifted(a) for a in expr.args]
            return expr if all(a is b for a, b in zip(args, expr.args)) else expr.func(*args)
        return self._symbol(expr)

    def defined(self, expr: sympy.Basic) -> sympy.Basic:
        """`expr` over the input symbols alone (what the shape environment, which never saw `ps<k>`, reasons on)."""
        if not self.formulas or not expr.free_symbols:
            return expr
        return expr.xreplace(self.formulas)

    def _symbol(self, expr: sympy.Expr) -> sympy.Symbol:
        sym = self.symbols.get(expr)
        if sym is None:
            sym = sympy.Symbol(f"ps{len(self.symbols)}", integer=True, nonnegative=expr.is_nonnegative)
            self.symbols[expr] = sym
            self.formulas[sym] = expr
        return sym


_PRECOMPUTED: ContextVar[PrecomputedSizes | None] = ContextVar("kiln_precomputed_sizes", default=None)


@contextlib.contextmanager
def precomputing(sizes: PrecomputedSizes):
    """While a graph lowers, lift the size expressions no kernel prints into `sizes`."""
    token = _PRECOMPUTED.set(sizes)
    try:
        yield
    finally:
        _PRECOMPUTED.reset(token)


def pinned(expr: sympy.Expr, shape_env, hint=None) -> sympy.Expr:
    """`expr`, or the constant the shape environment's ranges pin it to. The capture guards those ranges,
    so the constant holds on every call: `a[::3]` of `a` with 2 <= s0 <= 3 rows has ((s0 + 2)//3) rows,
    which is 1, and broadcasting it (`a[::3] / a`) must read its one row, not row i. A size that is 0 or 1 at
    the sizes traced (`hint`) is pinned too where the guards prove it: broadcasting `a[:round(s0 / 2)]` against
    `a` guarded `round(s0 / 2) == 1`, and read as a symbol the broadcast read row i of it (fuzz seed 840789)."""
    if shape_env is None or expr.is_number:
        return expr
    bounds = shape_env.bound_sympy(expr)
    if bounds.lower == bounds.upper and bounds.is_int and bounds.lower.is_finite:
        return sympy.Integer(int(bounds.lower))
    if hint in (0, 1) and proven(shape_env, sympy.Eq(expr, hint)):
        return sympy.Integer(hint)
    return expr


def proven(shape_env, relation) -> bool | None:
    """Whether the shape environment's guards and ranges decide `relation`: True, False, or None where they leave it
    open (or it holds a sympy function the environment's evaluator has no rule for: `Mod` of a `round`)."""
    try:
        result = shape_env._maybe_evaluate_static(relation)
    except KeyError:
        return None
    return None if result is None else bool(result)


def product(xs: Iterable) -> sympy.Expr:
    out = sympy.Integer(1)
    for x in xs:
        out = out * x
    return out


def contiguous_strides(size: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    strides, acc = [], sympy.Integer(1)
    for s in reversed(size):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def linear_index(idx: Sequence[sympy.Expr], stride: Sequence[sympy.Expr], offset=0) -> sympy.Expr:
    """`offset + sum(i * s)`: asked of the same views again and again (every layer of a model lowers and prints the
    same shapes), so each distinct question is answered once."""
    try:
        return _linear_index(tuple(idx), tuple(stride), offset)
    except TypeError:  # an unhashable value somewhere: no cache
        return _linear_index.__wrapped__(tuple(idx), tuple(stride), offset)


@functools.lru_cache(maxsize=65536)
def _linear_index(idx: tuple, stride: tuple, offset) -> sympy.Expr:
    terms = [sympy.sympify(offset)] + [i * s for i, s in zip(idx, stride) if s != 0 and i != 0]
    return sympy.Add(*terms)


@functools.lru_cache(maxsize=65536)
def expanded_coeff(expr, var: sympy.Symbol) -> sympy.Expr:
    """The coefficient of `var` in `expr` expanded (a load's stride along a loop): asked of every load of every
    kernel, the same indices in each repeated layer."""
    return sympy.expand(expr).coeff(var)


def unit_step(expr, var: sympy.Symbol, variables: Sequence[sympy.Symbol]) -> sympy.Expr:
    """How far `expr` moves when `var` steps from 0 to 1, the other `variables` at 0: a load's stride along a loop
    where the loop starts. For an affine index it is the coefficient; for one that wraps or divides the loop
    (`32*Mod(y0, 49) + 4704*FloorDiv(y0, 49)`, a window of 49 rows of 32 columns) it is the stride of the
    innermost run, which the coefficient (0: the variable is only inside the remainder) does not show."""
    return _unit_step(sympy.sympify(expr), var, tuple(variables))


@functools.lru_cache(maxsize=16384)
def _unit_step(expr: sympy.Expr, var: sympy.Symbol, variables: tuple) -> sympy.Expr:
    start = {v: sympy.Integer(0) for v in variables}
    return sympy.expand(expr.xreplace({**start, var: sympy.Integer(1)}) - expr.xreplace(start))


def affine_strides(index: sympy.Expr, variables: Sequence[sympy.Symbol]):
    """(offset, strides) if `index` is affine in `variables` with constant-in-vars coefficients, else None.

    A division or modulo of sizes alone (`32*FloorDiv(s0 + 31, 32)`, the row of a tensor whose last dimension is
    rounded up to a block, as memory-efficient attention's logsumexp is) is such a constant: only one that
    reads the variables makes the index other than affine."""
    return _affine_strides(sympy.sympify(index), tuple(variables))


@functools.lru_cache(maxsize=16384)
def _affine_strides(index: sympy.Expr, variables: tuple):
    fast = _affine_terms(index, variables)
    if fast is not None:
        return fast
    index = sympy.expand(index)
    if any(a.free_symbols & set(variables) for a in index.atoms(FloorDiv, Mod)):
        return None
    strides = []
    for v in variables:
        c = index.coeff(v)
        if c.free_symbols & set(variables):
            return None
        strides.append(c)
    offset = sympy.expand(index - sum((c * v for c, v in zip(strides, variables)), sympy.Integer(0)))
    if offset.free_symbols & set(variables):
        return None
    return offset, tuple(strides)


def _affine_terms(index: sympy.Expr, variables: tuple):
    """affine_strides without sympy.expand, for the usual index: a sum of `coefficient * variable` terms and
    terms free of the variables (what linear_index builds). None when a term is anything else."""
    where = {v: k for k, v in enumerate(variables)}
    strides = [sympy.Integer(0)] * len(variables)
    offset = []
    for term in sympy.Add.make_args(index):
        if not term.free_symbols & where.keys():
            offset.append(term)
            continue
        coeff, rest = term.as_coeff_Mul()
        factors = sympy.Mul.make_args(rest)
        hits = [f for f in factors if f in where]
        if len(hits) != 1:
            return None
        others = [f for f in factors if f is not hits[0]]
        c = coeff * sympy.Mul(*others)
        if c.free_symbols & where.keys() or any(isinstance(f, sympy.Add) for f in others):
            return None
        strides[where[hits[0]]] += c
    return sympy.Add(*offset), tuple(strides)


def simplify_in_ranges(index, ranges: tuple):
    """`index` (an expression or a mask) with each `a // d` and `a % d` folded where `a` is known to lie in
    [0, d) over `ranges` ((loop variable, size) pairs): to 0 and to `a`. A node whose dims merge runs of a
    kernel's loops reads a [N*H*W, C] view of an [N, H, W | C] value at `(h*W + w) // W` and the like,
    which are `h` and `w` only once the loops' bounds are known (a layer norm's statistics read back by its
    normalization, stored as a matmul's 2-d operand)."""
    if not isinstance(index, sympy.Basic) or not index.has(FloorDiv, Mod):
        return index
    return _simplify_in_ranges(index, ranges)


@functools.lru_cache(maxsize=16384)
def _simplify_in_ranges(index, ranges: tuple):
    bounds = dict(ranges)

    def fold(e):
        a, d = e.args
        top = _upper_bound(a, bounds)
        if top is None or not d.is_Integer or top >= int(d):
            return e
        return sympy.Integer(0) if isinstance(e, FloorDiv) else a

    while True:
        folded = index.replace(lambda e: isinstance(e, (FloorDiv, Mod)), fold)
        if isinstance(folded, sympy.Expr):
            folded = sympy.expand(folded)
        if folded == index:
            return folded
        index = folded


def _upper_bound(a: sympy.Expr, bounds: dict) -> int | None:
    """The largest value of `a` when it is a sum of non-negative multiples of variables in `bounds` (each below
    its size) and a non-negative constant; None otherwise (not known non-negative, or unbounded)."""
    top = 0
    for term in sympy.Add.make_args(sympy.expand(a)):
        c, rest = term.as_coeff_Mul()
        if not c.is_Integer or c < 0:
            return None
        if rest == 1:
            top += int(c)
            continue
        size = bounds.get(rest)
        if size is None or not sympy.sympify(size).is_Integer:
            return None
        top += int(c) * (int(size) - 1)
    return top


def simplify(index: sympy.Expr) -> sympy.Expr:
    """Fold `c*(a // d)*d + c*(a % d)` back into `c*a` (what merging then splitting dims leaves)."""
    if not index.has(FloorDiv):
        return index
    return _simplify(index)


@functools.lru_cache(maxsize=16384)
def _simplify(index: sympy.Expr) -> sympy.Expr:
    index = sympy.expand(index)
    changed = True
    while changed and isinstance(index, sympy.Add):
        changed = False
        terms = list(index.args)
        for t in terms:
            for f in t.atoms(FloorDiv):
                a, d = f.args
                c = sympy.expand(t / (f * d))
                if c.has(FloorDiv) or c.has(Mod) or c.free_symbols & a.free_symbols:
                    continue
                partner = sympy.expand(c * Mod(a, d))
                if partner in terms:
                    index = sympy.expand(index - t - partner + c * a)
                    changed = True
                    break
            if changed:
                break
    return index


def view_strides(old_size, old_stride, new_size):
    """Strides of `new_size` viewing a tensor of (old_size, old_stride) without a copy, or None.

    The algorithm of ATen's computeStride, over sympy sizes (exact equality only).
    """
    old_size, old_stride, new_size = (tuple(map(sympify, xs)) for xs in (old_size, old_stride, new_size))
    old = [(s, st) for s, st in zip(old_size, old_stride) if s != 1]
    new_stride = [None] * len(new_size)
    oi, ni = 0, 0
    while ni < len(new_size):
        if new_size[ni] == 1:
            new_stride[ni] = sympy.Integer(1)
            ni += 1
            continue
        if oi >= len(old):
            return None
        # take one chunk: old dims [oi, oj) and new dims [ni, nj) with equal products
        chunk_old, chunk_new = [old[oi]], [ni]
        po, pn = old[oi][0], new_size[ni]
        oi += 1
        ni += 1
        while po != pn:
            if proper_factor(pn, po):
                if ni >= len(new_size):
                    return None
                pn = pn * new_size[ni]
                chunk_new.append(ni)
                ni += 1
            else:
                if oi >= len(old):
                    return None
                po = po * old[oi][0]
                chunk_old.append(old[oi])
                oi += 1
        for (_, st0), (s1, st1) in zip(chunk_old, chunk_old[1:]):
            if sympy.expand(st0 - st1 * s1) != 0:
                return None
        stride = chunk_old[-1][1]
        for k in reversed(chunk_new):
            if new_size[k] == 1:
                new_stride[k] = sympy.Integer(1)
                continue
            new_stride[k] = stride
            stride = stride * new_size[k]
    if oi != len(old):
        return None
    return tuple(sympy.expand(s) for s in new_stride)


def proper_factor(a, b) -> bool:
    """a < b for products of sizes: true when b / a is a whole expression other than 1."""
    if a == 0 or b == 0:
        return False  # an empty tensor's sizes: b / a is no size (sympy's zoo, which compares with nothing)
    if a.is_Integer and b.is_Integer and int(a) > 0:  # static sizes: no sympy.cancel
        return int(b) % int(a) == 0 and int(b) > int(a)
    num, den = sympy.fraction(sympy.cancel(b / a))
    return den == 1 and num != 1 and not (num.is_number and num < 1)

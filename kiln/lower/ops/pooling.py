"""2-d pooling, forward and backward, as Pointwise bodies over a static window.

Max pooling (with indices): each output element of the forward is a max over at most MAX_TAPS
input elements, so it is an unrolled chain of `where`s over masked loads: it fuses the op before it
(relu -> max_pool) and runs in one kernel instead of an ATen call. Each input element of the
backward receives the gradient of the few output windows that can contain it, so the backward is a
masked gather that fuses into what follows (max_pool's backward -> relu's backward `where` -> conv's
backward).

Eager's semantics are kept exactly: a window's max is taken in row-major order, replacing the
current one when an element is greater or NaN (ties keep the first, the last NaN wins), starting
from the first in-bounds element; padding never wins. Integer tensors, symbolic windows (kernel, stride,
padding, dilation), windows of more than MAX_TAPS elements and backwards summing more than MAX_WINDOWS
windows per element raise Unsupported: ATen runs them. Input and output sizes may be symbols: a bound a tap
may cross is left out of its condition only where the guards prove it never does (`Axis.known`).

Average pooling is the same window summed in row-major order (in float32 for 16-bit inputs, as
ATen's CUDA kernels accumulate) and divided by eager's divisor: the taps inside the padded input
(count_include_pad), or inside the input, or `divisor_override`. Its backward divides each window's
gradient by that window's divisor and sums the windows in order. Where windows do not overlap (a 2x2
pool with stride 2, as in DenseNet's transitions) each input element is in one window, so the backward
is a pure gather that fuses into the batch norm's backward instead of an ATen kernel of its own
(benchmarks/gpu_profile.py shows the kernels).
"""
from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import FloorDiv, Mod, index_vars, sympify
from kiln.lower.layout import load_order_strides
from kiln.lower.ops.common import out_info
from kiln.lower.ops.registry import register
from kiln.lower.values import IndexFunction, Unsupported, cast, const

aten = torch.ops.aten

# Largest window unrolled (5x5): each tap costs a load and a few ops in every output element.
MAX_TAPS = 25
# An unrealized input is recomputed at every tap up to this body size (relu, a pointwise affine);
# a bigger one is stored once and read back.
TAP_INLINE_SIZE = 16
# Most output windows summed per input element in the backward (3x3 stride 1 reaches 9).
MAX_WINDOWS = 9


@dataclass(frozen=True)
class Axis:
    """One spatial dim of a pooling: kernel, stride, padding, dilation (ints), input and output sizes (sympy
    expressions, symbols under dynamic shapes), and `known`: whether a relation over the sizes holds on every
    call the guards admit (True, False, or None where they leave it open; `GraphLowering.known`)."""

    kernel: int
    stride: int
    padding: int
    dilation: int
    size: sympy.Expr
    out: sympy.Expr
    known: Callable[[sympy.Basic], bool | None] = field(compare=False)

    def lowest(self, tap: int) -> int:
        """The input position of `tap` in the first window."""
        return -self.padding + tap * self.dilation

    def highest(self, tap: int) -> sympy.Expr:
        """The input position of `tap` in the last window."""
        return (self.out - 1) * self.stride + self.lowest(tap)

    def always(self, relation) -> bool:
        """Whether `relation` holds on every call (False where the guards leave it open)."""
        return self.known(relation) is True


@dataclass(frozen=True)
class Tap:
    """One kernel position along an axis, at output index `o`: where it reads, when that is inside the
    input, and when it is the window's first inside position (eager's starting maximum)."""

    position: sympy.Expr
    inside: sympy.Basic
    first: sympy.Basic


def _static(x, what: str) -> int:
    x = sympify(x)
    if not x.is_Integer:
        raise Unsupported(f"symbolic {what} {x}")
    return int(x)


def _pair(v, what: str) -> tuple:
    v = [v] if isinstance(v, int) else list(v)
    if len(v) not in (1, 2):
        raise Unsupported(f"{what} of {len(v)} values")
    return tuple(_static(a, what) for a in v * (3 - len(v)))


def _axes(ctx, x: IndexFunction, out_size, kernel_size, stride, padding, dilation) -> tuple:
    """The two Axis of a pooling of `x` into `out_size`, with ATen's argument defaults (stride = kernel)."""
    if x.ndim not in (3, 4):
        raise Unsupported(f"2-d pooling of a {x.ndim}-d tensor")
    kernel = _pair(kernel_size, "kernel size")
    stride = _pair(stride, "stride") if stride else kernel
    padding, dilation = _pair(padding, "padding"), _pair(dilation, "dilation")
    sizes, outs = [sympify(s) for s in x.size[-2:]], [sympify(s) for s in out_size[-2:]]
    return tuple(Axis(*args, known=ctx.known) for args in zip(kernel, stride, padding, dilation, sizes, outs))


def _tap(axis: Axis, tap: int, o: sympy.Symbol) -> Tap | None:
    """Kernel position `tap` of `axis` at output index `o`, or None if it is never inside the input.
    Bounds that hold for every `o` are left out of the conditions."""
    lo, hi = axis.lowest(tap), axis.highest(tap)
    if axis.always(sympy.Lt(hi, 0)) or axis.always(sympy.Ge(lo, axis.size)):
        return None
    pos = o * axis.stride + lo
    inside = sympy.And(sympy.Ge(pos, 0) if lo < 0 else sympy.true,
                       sympy.true if axis.always(sympy.Lt(hi, axis.size)) else sympy.Lt(pos, axis.size))
    if tap == 0 or axis.always(sympy.Lt(axis.highest(tap - 1), 0)):
        first = sympy.true
    elif axis.lowest(tap - 1) >= 0:
        first = sympy.false
    else:
        first = sympy.Lt(pos - axis.dilation, 0)  # the previous tap falls in the left padding
    return Tap(pos, inside, first)


def _window(axes: tuple, out_vars) -> list:
    """The window's taps inside the input, row-major: (row Tap, column Tap) pairs."""
    rows = [t for t in (_tap(axes[0], k, out_vars[0]) for k in range(axes[0].kernel)) if t is not None]
    cols = [t for t in (_tap(axes[1], k, out_vars[1]) for k in range(axes[1].kernel)) if t is not None]
    return list(itertools.product(rows, cols))


def _cond(c) -> ir.Expr:
    return ir.Const(bool(c), torch.bool) if c in (sympy.true, sympy.false) else ir.IndexValue(c, torch.bool)


def _or(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    """a or b, folded where either is a constant (a tap known to start or never start the maximum)."""
    for c, other in ((a, b), (b, a)):
        if isinstance(c, ir.Const):
            return c if c.value else other
    return ir.Op("logical_or", (a, b), torch.bool)


def _and(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    """a and b, folded where either is a constant (a tap always inside the input)."""
    for c, other in ((a, b), (b, a)):
        if isinstance(c, ir.Const):
            return other if c.value else c
    return ir.Op("logical_and", (a, b), torch.bool)


def _pool_input(ctx, x: IndexFunction) -> IndexFunction:
    """`x` as read at every tap: inlined when its body is small (relu fuses), else stored once, in the
    order its own loads read (a channels-last convolution's batch norm + relu is stored channels-last,
    not transposed on the way to a pool that writes channels-last again)."""
    if x.buffer_view() is None and ir.expr_size(x.body) > TAP_INLINE_SIZE:
        return ctx.realize(x, stride=load_order_strides(x))
    return x


def max_pool_bodies(x: IndexFunction, axes: tuple, out_vars) -> tuple:
    """(values, indices) bodies at output index `out_vars`: eager's running max over the window.

    Each step reads the running value once (a NaN-propagating `maximum` keeping the earlier of equal
    values), so the bodies' trees grow linearly with the window, not exponentially: printers and other
    tree walks of the IR do not share common subexpressions."""
    lead, (oh, ow) = list(out_vars[:-2]), out_vars[-2:]
    value, index = None, const(0, torch.int64)
    for row, col in _window(axes, (oh, ow)):
        inside = sympy.And(row.inside, col.inside)
        v = ir.add_mask(x.at(lead + [row.position, col.position]), inside)
        start = _cond(sympy.And(row.first, col.first))
        if value is not None:
            better = ir.Op("logical_or", (ir.Op("gt", (v, value), torch.bool), ir.Op("isnan", (v,), torch.bool)),
                           torch.bool)
            start = _or(start, better)
        take = _and(_cond(inside), start)
        flat = ir.IndexValue(row.position * axes[1].size + col.position, torch.int64)
        index = flat if isinstance(take, ir.Const) else ir.Op("where", (take, flat, index), torch.int64)
        if inside != sympy.true:
            v = ir.Op("where", (_cond(inside), v, const(float("-inf"), x.dtype)), x.dtype)
        value = v if value is None else ir.Op("maximum", (v, value), x.dtype)
    return value, index


def _used_results(ctx, meta) -> dict:
    """The results (0: values, 1: indices) the graph reads, each with its getitem node. Tuple items reach
    their users without the graph's realize decisions, so the rule stores what is read itself; inference
    reads no indices."""
    for node in ctx.gm.graph.nodes:
        if node.meta.get("val") is meta and all(u.target is operator.getitem for u in node.users):
            return {u.args[1]: u for u in node.users if u.users}
    return {0: None, 1: None}


def _out_strides(meta) -> list:
    return [sympify(s) for s in meta.stride()]


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, meta, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Values and indices computed in one pass (both realized back to back, so one kernel writes both);
    ceil_mode needs nothing more: the output size comes from `meta` and the taps past the input are masked."""
    if not isinstance(meta, (tuple, list)) or len(meta) != 2:
        raise Unsupported("max_pool2d_with_indices without its (values, indices) result")
    size, dtype = out_info(meta[0])
    if not dtype.is_floating_point:
        raise Unsupported(f"max_pool2d of {dtype}")
    axes = _axes(ctx, x, size, kernel_size, stride, padding, dilation)
    if axes[0].kernel * axes[1].kernel > MAX_TAPS:
        raise Unsupported(f"a {axes[0].kernel}x{axes[1].kernel} window")
    x = _pool_input(ctx, x)
    bodies = max_pool_bodies(x, axes, index_vars("i", len(size)))
    used = _used_results(ctx, meta)
    outs = []
    for k, (body, m) in enumerate(zip(bodies, meta)):
        v = IndexFunction(size, m.dtype, body)
        if k in used:  # pooled values on a channels-last path (ResNet's stem) are stored in that layout
            stride = ctx.preferred_stride(used[k], v) if used[k] is not None else None
            v = ctx.realize(v, stride=stride or _out_strides(m))
        outs.append(v)
    return tuple(outs)


def _windows(axis: Axis, i: sympy.Symbol) -> list:
    """The output indices along `axis` whose window can hold input index `i`, each with the condition that
    it does (an index in range, `i` under one of its taps). Needs dilation 1 (`_dilated_windows` takes any)."""
    base = FloorDiv(i + axis.padding, axis.stride)
    out = []
    for j in range(-(-axis.kernel // axis.stride)):
        o = base - j
        conds = [sympy.Lt(Mod(i + axis.padding, axis.stride) + j * axis.stride, axis.kernel)
                 if (j + 1) * axis.stride > axis.kernel else sympy.true]
        if axis.padding // axis.stride - j < 0:
            conds.append(sympy.Ge(o, 0))
        # the last input index's window j is past the last output, unless the guards prove it is not:
        # (size - 1 + padding) // stride - j < out, written without the floor
        if not axis.always(sympy.Lt(axis.size - 1 + axis.padding, (axis.out + j) * axis.stride)):
            conds.append(sympy.Lt(o, axis.out))
        out.append((o, sympy.And(*conds)))
    return out


def _dilated_windows(axis: Axis, i: sympy.Symbol) -> list:
    """As `_windows`, for any dilation: tap k of output o reads i where o * stride - padding + k * dilation = i,
    so each tap names one output, o = (i + padding - k * dilation) / stride, when that is a whole number in
    [0, out). Taps ascending, so outputs descending, as `_windows` lists them. The numerators are shifted by a
    multiple of the stride to stay non-negative (FloorDiv and Mod are kiln's non-negative ones)."""
    shift = axis.stride * -(-(axis.kernel - 1) * axis.dilation // axis.stride)
    out = []
    for k in range(axis.kernel):
        numerator = i + axis.padding + shift - k * axis.dilation
        o = FloorDiv(numerator, axis.stride) - shift // axis.stride
        conds = [sympy.Eq(Mod(numerator, axis.stride), 0)]
        if axis.padding - k * axis.dilation < 0:
            conds.append(sympy.Ge(i + axis.padding - k * axis.dilation, 0))
        if not axis.always(sympy.Lt(axis.size - 1 + axis.padding - k * axis.dilation, axis.out * axis.stride)):
            conds.append(sympy.Lt(o, axis.out))
        out.append((o, sympy.And(*conds)))
    return out


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    """The type a pooling sums in: float32 for 16-bit inputs, as ATen's kernels accumulate."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _read_often(ctx, v: IndexFunction, reads: int) -> IndexFunction:
    """`v` read `reads` times per element: stored once unless it is cheap to recompute, in the order its own
    loads read (the sum of a residual block's channels-last gradients, on its way to the stem's pooling
    backward, was transposed to NCHW and then read by channels-last windows, both uncoalesced)."""
    return ctx.realize(v, stride=load_order_strides(v)) if reads > 1 and not v.is_trivial() else v


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(ctx, meta, grad, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    """grad_input[h, w] = sum of grad[oh, ow] over the windows (oh, ow) holding (h, w) whose saved index
    is h*W + w, summed in (oh, ow) order as eager accumulates. Indices are taken to come from the
    forward, so inside their own window (eager's scatter would honour any index of the plane)."""
    size, dtype = out_info(meta)
    if not dtype.is_floating_point:
        raise Unsupported(f"max_pool2d backward of {dtype}")
    axes = _axes(ctx, x, grad.size, kernel_size, stride, padding, dilation)
    variables = index_vars("i", len(size))
    lead, (h, w) = list(variables[:-2]), variables[-2:]
    windows = list(itertools.product(*((_windows if a.dilation == 1 else _dilated_windows)(a, i)
                                       for a, i in zip(axes, (h, w)))))
    if len(windows) > MAX_WINDOWS:
        raise Unsupported(f"{len(windows)} windows per input element")
    grad, indices = _read_often(ctx, grad, len(windows)), _read_often(ctx, indices, len(windows))
    acc = _accumulator(dtype)
    flat = ir.IndexValue(h * axes[1].size + w, torch.int64)
    total = None
    for (oh, in_h), (ow, in_w) in reversed(windows):  # oh, ow ascending
        inside = sympy.And(in_h, in_w)
        saved = ir.add_mask(cast(indices.at(lead + [oh, ow]), torch.int64), inside)
        hit = _and(_cond(inside), ir.Op("eq", (saved, flat), torch.bool))
        g = cast(ir.add_mask(grad.at(lead + [oh, ow]), inside), acc)
        term = ir.Op("where", (hit, g, const(0, acc)), acc)
        total = term if total is None else ir.Op("add", (total, term), acc)
    return IndexFunction(size, dtype, cast(total, dtype))


def _count(conds: list) -> ir.Expr:
    """How many of `conds` hold, as an int64 expression (the ones that always hold are folded)."""
    total = const(sum(1 for c in conds if c == sympy.true), torch.int64)
    for c in conds:
        if c not in (sympy.true, sympy.false):
            one = ir.Op("where", (_cond(c), const(1, torch.int64), const(0, torch.int64)), torch.int64)
            total = ir.Op("add", (total, one), torch.int64)
    return total


def _divisor(axes: tuple, out_vars, count_include_pad: bool, divisor_override) -> ir.Expr:
    """Eager's divisor of the window at output index `out_vars` (an int64 expression)."""
    if divisor_override:
        return const(int(divisor_override), torch.int64)
    counts = []
    for axis, o in zip(axes, out_vars):
        conds = []
        for k in range(axis.kernel):
            if count_include_pad:  # ATen clips the window to the padded input: [start, size + padding)
                last = axis.highest(k)
                pos = o * axis.stride + axis.lowest(k)
                conds.append(sympy.true if axis.always(sympy.Lt(last, axis.size + axis.padding))
                             else sympy.Lt(pos, axis.size + axis.padding))
            else:
                tap = _tap(axis, k, o)
                conds.append(sympy.false if tap is None else tap.inside)
        counts.append(_count(conds))
    if all(isinstance(c, ir.Const) for c in counts):
        return const(counts[0].value * counts[1].value, torch.int64)
    return ir.Op("mul", tuple(counts), torch.int64)


def _avg_axes(ctx, x, out_size, kernel_size, stride, padding) -> tuple:
    """The pooling's two Axis; ceil_mode needs nothing more (the output size comes from the result's shape,
    and `_divisor` clips each window as eager does)."""
    axes = _axes(ctx, x, out_size, kernel_size, stride, padding, 1)
    if axes[0].kernel * axes[1].kernel > MAX_TAPS:
        raise Unsupported(f"a {axes[0].kernel}x{axes[1].kernel} window")
    for axis in axes:  # a last window that starts in the right padding (eager writes 0), where sizes say so;
        # ATen's output size (pooling_output_shape) drops such a window, so symbolic sizes need no check
        if axis.always(sympy.Ge((axis.out - 1) * axis.stride - axis.padding, axis.size)):
            raise Unsupported("an average-pooling window outside the input")
    return axes


@register(aten.avg_pool2d.default)
def avg_pool2d(ctx, meta, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    size, dtype = out_info(meta)
    if not dtype.is_floating_point:
        raise Unsupported(f"avg_pool2d of {dtype}")
    axes = _avg_axes(ctx, x, size, kernel_size, stride, padding)
    x = _pool_input(ctx, x)
    out_vars = index_vars("i", len(size))
    lead, (oh, ow) = list(out_vars[:-2]), out_vars[-2:]
    acc = _accumulator(dtype)
    total = None
    for row, col in _window(axes, (oh, ow)):
        v = cast(ir.add_mask(x.at(lead + [row.position, col.position]), sympy.And(row.inside, col.inside)), acc)
        total = v if total is None else ir.Op("add", (total, v), acc)
    divisor = cast(_divisor(axes, (oh, ow), count_include_pad, divisor_override), acc)
    return IndexFunction(size, dtype, cast(ir.Op("truediv", (total, divisor), acc), dtype))


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(ctx, meta, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    """grad_input[h, w] = sum of grad[oh, ow] / divisor(oh, ow) over the windows holding (h, w), in (oh, ow)
    order, as ATen's kernel accumulates."""
    size, dtype = out_info(meta)
    if not dtype.is_floating_point:
        raise Unsupported(f"avg_pool2d backward of {dtype}")
    axes = _avg_axes(ctx, x, grad.size, kernel_size, stride, padding)
    variables = index_vars("i", len(size))
    lead, (h, w) = list(variables[:-2]), variables[-2:]
    windows = list(itertools.product(_windows(axes[0], h), _windows(axes[1], w)))
    if len(windows) > MAX_WINDOWS:
        raise Unsupported(f"{len(windows)} windows per input element")
    grad = _read_often(ctx, grad, len(windows))
    acc = _accumulator(dtype)
    total = None
    for (oh, in_h), (ow, in_w) in reversed(windows):  # oh, ow ascending
        inside = sympy.And(in_h, in_w)
        g = cast(ir.add_mask(grad.at(lead + [oh, ow]), inside), acc)
        term = ir.Op("truediv", (g, cast(_divisor(axes, (oh, ow), count_include_pad, divisor_override), acc)), acc)
        if inside != sympy.true:
            term = ir.Op("where", (_cond(inside), term, const(0, acc)), acc)
        total = term if total is None else ir.Op("add", (total, term), acc)
    return IndexFunction(size, dtype, cast(total, dtype))

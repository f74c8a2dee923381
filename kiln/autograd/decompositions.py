"""The autograd stage's adjustments to its caller's decomposition table while tracing.

Tracing applies `tracing_table(decompositions)`: the ops functionalization needs
decomposed (always), plus the table the caller passes to `aot_compile` (the code
generator's choice; none for `aot_eager`, whose graphs run the ops eager runs).
Decompositions apply below autograd, so the backward formulas are eager's; a
decomposed backward op (e.g. `native_layer_norm_backward` in `core_aten()`)
shows up as its pieces in the backward graph, where the partitioner and the
code generator can see them.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from kiln.autograd.draws_in_place import DRAWS, LIKE, draw_in_place, draw_like
from kiln.autograd.random_from import random_from_in_place

aten = torch.ops.aten

_TORCH_BATCH_NORM = get_decompositions([
    aten.native_batch_norm,
    aten._native_batch_norm_legit,
])


def _updating_statistics(op: torch._ops.OpOverload) -> Callable:
    """`op` (a batch norm that writes its running statistics in place) as its functional form plus `copy_`.

    The functional op runs eager's kernel, which on the CPU takes the mean as a sum over the count (-inf for a
    column holding -inf and finite values), where torch's decomposition takes var_mean's (nan there). Without
    running statistics nothing is written, and torch's decomposition serves. Outside training the op reads them
    and writes nothing: `_native_batch_norm_legit_no_training`, which the code generator's table decomposes as
    eager computes it (lower/decompositions.py) and `aot_eager` runs as eager's kernel."""
    def decompose(input, weight, bias, running_mean, running_var, training, momentum, eps):
        if running_mean is None or running_var is None:
            return _TORCH_BATCH_NORM[op](input, weight, bias, running_mean, running_var, training, momentum, eps)
        if not training:
            return aten._native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                                             momentum, eps)
        out, mean, invstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
            input, weight, bias, running_mean, running_var, training, momentum, eps)
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)
        return out, mean, invstd
    return decompose


FUNCTIONALIZATION = {
    **_TORCH_BATCH_NORM,
    getattr(aten.random_, "from"): random_from_in_place,  # `from` is a keyword: FX cannot print the op's name
    aten.native_batch_norm.default: _updating_statistics(aten.native_batch_norm.default),
    aten._native_batch_norm_legit.default: _updating_statistics(aten._native_batch_norm_legit.default),
    **{op: draw_in_place(op) for op in DRAWS},
    **{op: draw_like(op) for op in LIKE},
}
"""Ops that write their inputs in place (batch norm's running statistics) but that
functionalization would keep as they are, turn into an op FX cannot print (`random_.from`), or
into a draw laid out otherwise than eager's (`bernoulli_` on a transposed tensor): decomposed into
pure ops plus `copy_`."""


UNSAFE_FOR_TRAINING = (
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
)
"""Forward ops whose decomposition returns auxiliary outputs (logsumexp) that their fused
backward kernel does not expect: decomposing the forward while autograd still runs the
fused backward gives wrong gradients (measured: errors of order 10 on SDPA's q, k, v with
`core_aten()`). Training traces keep them whole; inference may decompose them."""


FILLS = (aten.fill_.Scalar, aten.zero_.default)
"""In-place ops that write one value into every element, whatever it held: eager allows them into a tensor whose
elements share memory (an expanded tensor), where other in-place ops raise (eager_errors.py)."""


VIEW_BACKWARDS = (aten.slice_backward.default, aten.select_backward.default, aten.diagonal_backward.default)
"""A view's backward, which the code generator's table writes as a scatter into zeros (`slice_scatter`). ATen
differentiates those scatters for real dtypes only, and a backward run with create_graph=True runs its ops under
autograd: a complex gradient keeps the view's backward (complex tensors run through ATen's ops anyway)."""


def _real_only(decomposed: Callable) -> Callable:
    """`decomposed` for real gradients; NotImplemented (the op traced as it is) for a complex one."""
    def decompose(grad, *args, **kwargs):
        return NotImplemented if grad.is_complex() else decomposed(grad, *args, **kwargs)
    return decompose


def _fill_once(op: torch._ops.OpOverload, decomposed: Callable | None) -> Callable:
    """`op` (of `FILLS`) as a fill of its tensor's memory seen once where a dimension of stride 0 repeats it (that
    dimension cut to its first index): the graph then holds no write into a view with such overlap, which
    functionalization could not scatter back (`as_strided_scatter` refuses it, as eager's other in-place ops
    do), but a write into a view of the memory through a view with overlap (functionalize.py,
    `_writes_through_overlaps`). Other tensors get the caller's decomposition, or the op itself: an empty one
    among them, which the cut would give elements."""
    def decompose(t, *args, **kwargs):
        repeated = [_is(st, 0) and not _is(sz, 1) for sz, st in zip(t.shape, t.stride())]
        if any(repeated) and not any(_is(sz, 0) for sz in t.shape):
            once = [1 if r else sz for sz, r in zip(t.shape, repeated)]
            op(t.as_strided(once, t.stride(), t.storage_offset()), *args, **kwargs)
            return t
        return decomposed(t, *args, **kwargs) if decomposed is not None else NotImplemented
    return decompose


def _is(size, value: int) -> bool:
    """`size == value`, a symbolic size compared as an expression: no guard is added on the graph's sizes."""
    return size.node.expr == value if isinstance(size, torch.SymInt) else size == value


def core_aten() -> dict:
    """PyTorch's table down to the core ATen op set: what a code generator usually wants."""
    return core_aten_decompositions()


def tracing_table(decompositions: dict | Callable[[], dict] | None, training: bool) -> dict:
    """The table tracing uses: the caller's (or what the caller's function makes: a table built only when a
    graph is traced, not when its traces come from the compile cache), over the ones functionalization needs."""
    if callable(decompositions):
        decompositions = decompositions()
    table = {**FUNCTIONALIZATION, **(decompositions or {})}
    for op in FILLS:
        table[op] = _fill_once(op, table.get(op))
    for op in VIEW_BACKWARDS:
        if op in table:
            table[op] = _real_only(table[op])
    if training:
        for op in UNSAFE_FOR_TRAINING:
            table.pop(op, None)
    return table

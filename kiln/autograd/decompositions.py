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

aten = torch.ops.aten

FUNCTIONALIZATION = get_decompositions([
    aten.native_batch_norm,
    aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_no_training,
])
"""Ops that write their inputs in place (batch norm's running statistics) but that
functionalization would keep as they are: decomposed into pure ops plus `copy_`."""


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


def core_aten() -> dict:
    """PyTorch's table down to the core ATen op set: what a code generator usually wants."""
    return core_aten_decompositions()


def tracing_table(decompositions: dict | Callable[[], dict] | None, training: bool) -> dict:
    """The table tracing uses: the caller's (or what the caller's function makes: a table built only when a
    graph is traced, not when its traces come from the compile cache), over the ones functionalization needs."""
    if callable(decompositions):
        decompositions = decompositions()
    table = {**FUNCTIONALIZATION, **(decompositions or {})}
    if training:
        for op in UNSAFE_FOR_TRAINING:
            table.pop(op, None)
    return table

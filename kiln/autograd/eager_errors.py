"""Errors eager raises that the compiled graphs would lose, found in the traced ATen graph.

Eager's kernels check things that tracing does not (fake tensors run no such check):
an in-place op whose result dtype cannot be cast into the written tensor (`bool_t.mul_(2)`),
a write into a tensor with internal overlap (an expanded tensor) or that partially overlaps another
input of the op (`y[1:].copy_(y[:-1])`), subtraction or negation of
a bool tensor. Functionalization then replaces the in-place op by its out-of-place variant and
a cast-free copy, and dead-code elimination drops an unused op, taking its check with it; an
unused integer division by zero loses eager's ZeroDivisionError the same way, and an unused gather,
index_select, embedding or nll_loss its IndexError for an index out of range. A write into a tensor whose
elements share memory in a way eager's kernels do not check (overlapping windows) raises nothing in eager, whose
kernel writes in its own order: only running the op computes what it computes.

`eager_error` finds such ops; a graph with one runs eagerly, op by op, so that it raises
exactly what eager raises (statically doomed ops raise on every call; a dead integer
division or indexing only when it meets a zero or an index out of range). Live integer divisions and
indexing need nothing: the compiled graph runs them, and raises as eager does. A reduction without
identity over an empty tensor (`max()` of a size-0 tensor) raises in eager and not in fake tensors, used
or not: such a graph runs eagerly too.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.autograd.decompositions import FILLS
from kiln.autograd.functionalize import fake_run, out_of_place
from kiln.autograd.partition import ancestors
from kiln.autograd.signature import TensorSpec
from kiln.effects import written_arguments

aten = torch.ops.aten

_SUBTRACTIONS = frozenset((aten.sub.Tensor, aten.sub.Scalar, aten.sub_.Tensor, aten.sub_.Scalar, aten.rsub.Tensor,
                           aten.rsub.Scalar, aten.neg.default, aten.neg_.default))

_ALPHA_OPS = frozenset((aten.add.Tensor, aten.add_.Tensor, aten.sub.Tensor, aten.sub_.Tensor, aten.rsub.Tensor))

_INTEGER_DIVISIONS = frozenset((aten.div.Tensor_mode, aten.div.Scalar_mode, aten.div_.Tensor_mode,
                                aten.div_.Scalar_mode, aten.floor_divide.default, aten.floor_divide.Scalar,
                                aten.floor_divide_.Tensor, aten.floor_divide_.Scalar, aten.remainder.Tensor,
                                aten.remainder.Scalar, aten.remainder_.Tensor, aten.remainder_.Scalar,
                                aten.fmod.Tensor, aten.fmod.Scalar, aten.fmod_.Tensor, aten.fmod_.Scalar))


_VALUE_CHECKED = frozenset((
    aten.index_select.default, aten.gather.default, aten.embedding.default, aten.index.Tensor, aten.take.default,
    aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, aten.scatter.src, aten.scatter.value,
    aten.scatter.reduce, aten.scatter.value_reduce, aten.scatter_add.default, aten.scatter_reduce.two,
    aten.index_add.default, aten.index_copy.default, aten.index_fill.int_Scalar, aten.index_fill.int_Tensor,
    aten.index_put.default, aten.index_reduce.default, aten.binary_cross_entropy.default))
"""Ops whose eager kernel checks the values it reads (an index out of range, binary cross-entropy's input outside
[0, 1]) and raises: kiln's kernels report a live one's (lower/ops/indexing.py, scatters.py) or run it as ATen's
(lower/decompositions.py KEEP); an unused one is dead code, so its graph runs op by op."""


def _tensor_args(node: torch.fx.Node) -> list[torch.Tensor]:
    return [a.meta["val"] for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]


def _bool_subtraction(node: torch.fx.Node) -> str | None:
    """A bool operand of a subtraction: a bool tensor, or a Python bool (`t - True`), which eager wraps
    into a bool tensor and refuses alike."""
    operands = node.args[:2]
    if node.target in _SUBTRACTIONS and (any(t.dtype == torch.bool for t in _tensor_args(node))
                                         or any(isinstance(a, bool) for a in operands)):
        return "subtraction or negation of a bool tensor"
    return None


def _bool_alpha(node: torch.fx.Node) -> str | None:
    """`alpha=True` (or False) of an add or a subtraction whose result is not bool: eager refuses it."""
    alpha = node.kwargs.get("alpha")
    result = node.meta.get("val")
    if (node.target in _ALPHA_OPS and isinstance(alpha, bool) and isinstance(result, torch.Tensor)
            and result.dtype != torch.bool):
        return "a bool alpha for a non-bool result"
    return None


def _in_place_cast(node: torch.fx.Node) -> str | None:
    """An in-place op whose out-of-place result dtype cannot be cast to the written tensor's."""
    functional = out_of_place(node.target) if _writes(node) else None
    written = node.args[0].meta.get("val") if functional is not None and node.args else None
    if not isinstance(written, torch.Tensor) or node.target is aten.copy_.default:
        return None
    try:
        result = fake_run(functional, node)
    except Exception:  # noqa: BLE001 - not decidable here: the compiled graph decides
        return None
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, written.dtype):
        return f"in-place result type {result.dtype} cannot be cast to {written.dtype}"
    return None


def _internal_overlap(node: torch.fx.Node) -> str | None:
    """A write into a tensor some of whose elements share memory (an expanded tensor): eager raises, or writes
    anyway (`masked_fill_`, `index_put_`, with a deprecation warning). A fill, which eager allows, reaches the
    graph as a fill of the memory seen once (decompositions.py, `FILLS`)."""
    written = _first_written(node)
    if written is not None and torch._debug_has_internal_overlap(written) == 1:
        return "an in-place write into a tensor with internal overlap"
    return None


def _order_dependent_overlap(node: torch.fx.Node) -> str | None:
    """A write other than a fill into a tensor whose elements share memory in a way ATen does not check (rows
    that are overlapping windows of one vector, `as_strided((4, 3), (1, 1))`): eager's kernel writes each
    element in its own order, each reading what earlier ones wrote (`add_(1)` adds once per element that shares
    the memory), which no functional graph computes."""
    written = _first_written(node)
    if (written is None or node.target in FILLS or torch._debug_has_internal_overlap(written) != 2
            or TensorSpec.of(written).symbolic or not TensorSpec.of(written).overlapping):
        return None
    return "an in-place write into a tensor whose elements share memory, in the order of eager's kernel"


def _first_written(node: torch.fx.Node) -> torch.Tensor | None:
    first = node.args[0] if node.args else None  # a foreach op writes a list of tensors
    written = first.meta.get("val") if _writes(node) and isinstance(first, torch.fx.Node) else None
    return written if isinstance(written, torch.Tensor) else None


def _partial_overlap(node: torch.fx.Node) -> str | None:
    """A write into a tensor that shares some, not all, of its memory with another input of the op
    (`y[1:].copy_(y[:-1])`): eager's kernels refuse it (functionalization would compute it as if the
    input had been cloned)."""
    written = _written_values(node)
    others = [v for v in _tensor_args(node) if all(v is not w for w in written)]
    if any(_overlaps_partially(w, v) for w in written for v in others):
        return "an in-place write into a tensor that partially overlaps an input of the op"
    return None


_NO_IDENTITY_REDUCTIONS = frozenset((
    aten.max.default, aten.min.default, aten.max.dim, aten.min.dim, aten.amax.default, aten.amin.default,
    aten.argmax.default, aten.argmin.default, aten.aminmax.default, aten.mode.default, aten.kthvalue.default,
    aten.median.default, aten.median.dim, aten.nanmedian.default, aten.nanmedian.dim))
"""Reductions with no identity element: over an empty extent eager refuses some (`max()`, `amax(0)` of a (0, 3)
tensor), while fake tensors run several without a check, and an unused one is dead code to the compiled graph."""


def _empty_reduction(node: torch.fx.Node) -> str | None:
    """A reduction without identity over an empty input that eager refuses: the op itself decides, run on an
    empty CPU tensor of the input's geometry (no data is read, and each op's rule about which empty extents it
    refuses stays its own). Sizes are static where a tensor is empty: a size 0 specializes."""
    if node.target not in _NO_IDENTITY_REDUCTIONS:
        return None
    values = _tensor_args(node)
    if not values or any(v.numel() != 0 for v in values):
        return None
    try:
        empties = {a: _empty_like(a.meta["val"]) for a in node.all_input_nodes}
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: empties[a])
    except (TypeError, KeyError):  # symbolic geometry: not decidable here
        return None
    try:
        node.target(*args, **kwargs)
    except (RuntimeError, IndexError) as e:
        return f"a reduction eager refuses over an empty extent ({type(e).__name__}: {str(e).splitlines()[0]})"
    return None


def _empty_like(value: torch.Tensor) -> torch.Tensor:
    if any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride())):
        raise TypeError("symbolic geometry")
    return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype)


STATIC_CHECKS: tuple[Callable[[torch.fx.Node], str | None], ...] = (_bool_subtraction, _bool_alpha, _in_place_cast,
                                                                  _internal_overlap, _order_dependent_overlap,
                                                                  _partial_overlap, _empty_reduction)
"""Checks of eager's kernels that depend only on dtypes and strides: an op failing one raises on every call."""


def eager_error(gm: torch.fx.GraphModule) -> str | None:
    """Why `gm` must run eagerly to raise as eager does, or None."""
    live = _live_nodes(gm.graph)
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for check in STATIC_CHECKS:
            reason = check(node)
            if reason is not None:
                return f"{reason} ({node.target})"
        if node.target in _INTEGER_DIVISIONS and node not in live and not _floating(node):
            return f"an unused integer division, whose division by zero eager raises ({node.target})"
        if node.target in _VALUE_CHECKED and node not in live:
            return f"an unused op whose values eager checks ({node.target})"
    return None


def _written_values(node: torch.fx.Node) -> list[torch.Tensor]:
    """The fake values of the arguments `node`'s op writes (`self` of an in-place op, `out`)."""
    if not _writes(node):
        return []
    values = [a.meta.get("val") for a in written_arguments(node.target._schema, node.args, node.kwargs)
              if isinstance(a, torch.fx.Node)]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _overlaps_partially(a: torch.Tensor, b: torch.Tensor) -> bool:
    """ATen's `get_overlap_status(a, b) == Partial` (what its in-place kernels refuse), for fake tensors:
    on one storage, their memory ranges intersect without being the same range with the same strides.
    Undecidable with symbolic sizes, where it answers yes: the graph then runs op by op, which decides
    per call."""
    if StorageWeakRef(a.untyped_storage()) != StorageWeakRef(b.untyped_storage()):
        return False
    geometry = (a.storage_offset(), b.storage_offset(), *a.shape, *b.shape, *a.stride(), *b.stride())
    if any(isinstance(v, torch.SymInt) for v in geometry):
        return True
    if a.numel() == 0 or b.numel() == 0 or not (_dense(a) and _dense(b)):
        return False  # ATen's "too hard": no check
    a_begin, b_begin = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    a_end, b_end = a_begin + a.numel() * a.element_size(), b_begin + b.numel() * b.element_size()
    if (a_begin, a_end) == (b_begin, b_end):
        return a.stride() != b.stride()
    return a_begin < b_end and b_begin < a_end


def _dense(t: torch.Tensor) -> bool:
    """Are `t`'s elements one gapless, non-overlapping block of memory, in some order of its dimensions?"""
    expected = 1
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _phase_checked_backward(node: torch.fx.Node) -> str | None:
    """An eigen- or singular-vector decomposition producing complex vectors: eager's backward checks that the
    loss does not depend on each vector's phase (`linalg_eig_backward`, `svd_backward`), a check on values
    that the traced backward does not carry (eager raises where the compiled backward returns numbers)."""
    if node.target in _PHASE_CHECKED_BACKWARDS and any(t.is_complex() for t in _outputs(node)):
        return "a decomposition whose backward checks the loss against the vectors' phase"
    return None


def _outputs(node: torch.fx.Node) -> list[torch.Tensor]:
    val = node.meta.get("val")
    return [v for v in (val if isinstance(val, (tuple, list)) else (val,)) if isinstance(v, torch.Tensor)]


_PHASE_CHECKED_BACKWARDS = frozenset((aten.linalg_eig.default, aten._linalg_svd.default, aten.linalg_svd.default))
"""Ops whose eager backward raises on an ill-defined loss (one that depends on the complex vectors' phase)."""


def backward_error(gm: torch.fx.GraphModule) -> str | None:
    """Why the joint graph `gm` must run eagerly for its backward to raise as eager's does, or None."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            reason = _phase_checked_backward(node)
            if reason is not None:
                return f"{reason} ({node.target})"
    return None


def _writes(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable


def _floating(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and (val.is_floating_point() or val.is_complex())


def _live_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes the outputs or a write into an input read, directly or not: what dead-code elimination keeps."""
    return ancestors([n for n in graph.nodes if n.op == "output" or (_writes(n) and n.args and _of_input(n.args[0]))])


def _of_input(node) -> bool:
    """Is `node` a graph input, or a view or in-place result of one?"""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.args and (
            getattr(node.target, "is_view", False) or _writes(node)):
        node = node.args[0]
    return isinstance(node, torch.fx.Node) and node.op == "placeholder"

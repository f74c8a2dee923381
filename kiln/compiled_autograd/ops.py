"""What the compiled-autograd graph calls at run time besides ATen ops: the user's hooks and Python
backward functions, `.grad` accumulation, and node functions the engine says cannot be traced.

These are the graph's call nodes; a backend inlines them (kiln's capture traces the user's hook like
any Python function) or calls them as they are.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.compiled_autograd import engine


class FunctionTable:
    """The engine's functional node backwards, bound by name once per process (`bind_function`)."""

    def __init__(self) -> None:
        self._fns: dict[str, tuple[Callable, bool]] = {}
        self._custom_counts: dict[str, int] = {}

    def bind(self, name: str, fn: Callable, is_custom_function: bool, is_traceable: bool) -> str:
        if is_custom_function:  # several C++ custom functions share a class name: number them
            base = f"CppNode{name}"
            count = self._custom_counts.get(base, 0)
            self._custom_counts[base] = count + 1
            name = f"{base}{count}"
        self._fns[name] = (fn, is_traceable)
        return name

    def get(self, name: str) -> Callable:
        if name not in self._fns:
            raise RuntimeError(f"compiled autograd: the engine did not bind node function {name!r} to kiln; "
                               "it binds each once per process, so torch's own compiled autograd probably ran "
                               "first in this process; use one implementation per process")
        return self._fns[name][0]

    def traceable(self, name: str) -> bool:
        return self._fns[name][1]


FUNCTIONS = FunctionTable()


@dataclass
class Stats:
    """Captured graphs, in order (tests and explain() count them)."""

    graphs: list = field(default_factory=list)


STATS = Stats()


def call_hook(hook: Callable, *args: Any, hook_type: str) -> Any:
    """Run a user hook; None means "keep the value" (a post-accumulate-grad hook must return None)."""
    result = hook(*args)
    if result is None:
        return args[0]
    if hook_type == "post_acc_grad_hook":
        raise RuntimeError("Tensor post accumulate grad hooks should return None.")
    return result


class _BackwardContext:
    """The ctx a Python autograd.Function's backward sees: the original ctx, with `saved_tensors` taken
    from the graph's inputs (the engine lifted them, so the compiled graph owns their values)."""

    def __init__(self, ctx: Any, saved_tensors: list) -> None:
        self._ctx = ctx
        self.saved_tensors = tuple(saved_tensors)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def call_backward(ctx: Any, saved_tensors: list, *grads: Any) -> tuple:
    """A Python autograd.Function's `backward(ctx, *grads)`, always as a tuple."""
    result = ctx._forward_cls.backward(_BackwardContext(ctx, saved_tensors), *grads)
    return result if isinstance(result, tuple) else (result,)


def call_opaque(fn_name: str, *args: Any) -> Any:
    """A node function the engine marked untraceable (a C++ custom autograd function): run as is."""
    return FUNCTIONS.get(fn_name)(*args)


def copy_slices_prologue(inputs, base_sizes, base_strides, base_storage_offset, view_sizes, view_strides,
                         view_storage_offset):
    """CopySlices (the backward of an in-place op on a view), first half: the grad of the base, and the
    slice of it the view covers."""
    grad = inputs[0]
    result = grad.new_empty_strided(base_sizes, base_strides)
    result.copy_(grad)
    offset = view_storage_offset - base_storage_offset
    grad_slice = result.as_strided(view_sizes, view_strides, offset)
    return [result, grad_slice, grad_slice.clone(memory_format=torch.contiguous_format)]


def copy_slices_epilogue(needs_input_grad, result, res, grad_slice):
    """CopySlices, second half: the in-place op's grad written back into the slice."""
    grad_inputs = [None] * len(needs_input_grad)
    for i, needed in enumerate(needs_input_grad):
        if not needed:
            continue
        if i == 0:
            grad_slice.copy_(res[i])
            grad_inputs[i] = result
        else:
            grad_inputs[i] = res[i]
    return grad_inputs


@dataclass(frozen=True)
class RunPlan:
    """What the run wrapper does around a captured graph: which leaves get the graph's new grads
    (`assign`, or `accumulate` onto whatever `.grad` holds at run time for engines that do not pass it
    to the graph), and the hooks that must see those grads (post-accumulate-grad hooks)."""

    grads: tuple[tuple[int, str], ...]
    after_graph: tuple[tuple[str, int, int | None, int | None], ...]  # kind, hook, input index, value index
    # kiln forward graphs whose backward the graph inlined: (hook index of the ctx, tangents present). Each
    # checks, as its own backward would, that what eager would have saved was not written since the forward.
    version_checks: tuple[tuple[int, tuple], ...] = ()


def size_carrier(size: int) -> torch.Tensor | int:
    """A size the engine marked dynamic, passed to the graph as the second dimension of an empty tensor:
    a compiler that specializes Python ints (kiln's capture guards them as constants) makes a tensor's
    changing dimension symbolic instead, so one compiled graph serves every value. Sizes below 1 pass as
    they are (no tensor has them; 0 specializes anyway)."""
    return torch.empty(0, size) if size > 0 else size


def carried_size(carrier: torch.Tensor | int) -> int:
    """The size `size_carrier` packed."""
    return carrier.size(1) if isinstance(carrier, torch.Tensor) else carrier


def run_graph(plan: RunPlan, compiled_fn: Callable, inputs: list, sizes: Any, scalars: Any, hooks: Any,
              packed_data: Any = ()):
    """How the engine calls a cached graph: with the values it collected from the autograd graph."""
    for ctx_index, present in plan.version_checks:
        hooks[ctx_index].versions.check(list(present))
    leaves = [inputs[i] for i, _ in plan.grads]
    after_inputs = [None if i is None else inputs[i] for _, _, i, _ in plan.after_graph]
    held = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    with engine.disabled():
        carried = [size_carrier(s) for s in sizes]
        outputs, grads, values = compiled_fn(inputs, carried, list(scalars), hooks, packed_data)
        held.update(t.untyped_storage().data_ptr() for t in outputs if isinstance(t, torch.Tensor))
        for leaf, grad, (_, how) in zip(leaves, grads, plan.grads):
            _set_grad(leaf, grad, how, held)
        for (kind, hook, _, value), leaf in zip(plan.after_graph, after_inputs):
            if kind == "cpp_tensor_pre_hook":
                torch._C._dynamo.compiled_autograd.call_cpp_tensor_pre_hooks(hook, values[value])
            else:
                call_hook(hooks[hook], leaf, hook_type=kind)
    return outputs


def _set_grad(leaf: torch.Tensor, grad: torch.Tensor, how: str, held: set) -> None:
    """`leaf.grad = grad` with AccumulateGrad's rules: the grad is taken as it is (detached, as eager takes
    a grad no one else holds), unless its storage is held elsewhere (an input of the graph, an output
    returned to the caller, another leaf's grad of this call: `held`, which records what it takes), it does
    not follow the leaf's layout, or it is a view of a larger buffer (which it would keep alive): then it is
    copied into a fresh tensor shaped like the leaf."""
    if how == "accumulate" and leaf.grad is not None:
        leaf.grad.add_(grad) if not torch.is_grad_enabled() else setattr(leaf, "grad", leaf.grad + grad)
        return
    storage = grad.untyped_storage()
    spans_storage = grad.storage_offset() == 0 and storage.nbytes() == grad.numel() * grad.element_size()
    if storage.data_ptr() in held or grad.stride() != leaf.stride() or (grad._is_view() and not spans_storage):
        grad = torch.empty_like(leaf, dtype=grad.dtype).copy_(grad)
    elif grad.numel():  # empty tensors share the null address: none is held by another
        held.add(storage.data_ptr())
    leaf.grad = grad.detach()

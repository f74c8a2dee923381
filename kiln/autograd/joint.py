"""Tracing a captured graph down to ATen ops, with its backward when it needs one.

Tracing runs the graph on fake tensors under `make_fx`'s dispatch-level tracer,
which sits below autograd: every ATen op the forward runs is recorded, and so is
every op the autograd engine runs inside `torch.autograd.grad`. That is how the
*joint* graph gets the backward: the forward is run with the inputs that require
grad marked as such, and `torch.autograd.grad(outputs, inputs, tangents)` is
traced with the tangents (the incoming gradients) as extra graph inputs.

The joint graph's signature is `(*primals, *tangents) -> (*outputs, *grads)`,
where `grads` holds only the gradients autograd actually produced (`grad_mask`
says which inputs get one). The traced graphs are not functional yet: in-place
ops and input mutations are recorded as the program ran them; `functionalize`
removes them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import compiled_autograd
from kiln.autograd import autocast_cache
from kiln.autograd.autocast_cache import CastCache
from kiln.autograd.eager_formulas import eager_formulas
from kiln.autograd.opaque_backward import opaque_custom_op_backwards
from kiln.autograd.signature import OutputSignature, TensorSpec, gradient_at_view, gradient_off_view, symbolic_dispatch
from kiln.runtime.lazy_graphs import lazily_built


def trace_forward(fn: Callable, input_specs: list[TensorSpec], decompositions: dict,
                  mode: FakeTensorMode | None = None) -> torch.fx.GraphModule:
    """The ATen graph of `fn` on flat inputs, traced without autograd (the inference graph)."""
    mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [s.fake(mode) for s in input_specs]
    with mode, symbolic_dispatch(mode), torch.no_grad(), lazily_built():  # in the mode: factories make fakes too
        return make_fx(fn, decomposition_table=decompositions)(*fakes)


@dataclass
class JointGraph:
    """The traced joint graph and which flat inputs received a gradient from it."""

    gm: torch.fx.GraphModule
    num_primals: int
    num_tangents: int
    num_outputs: int
    grad_mask: list[bool]


def trace_joint(graph_function: Callable, input_specs: list[TensorSpec], requires_grad: tuple[bool, ...],
                signature: OutputSignature, decompositions: dict, mode: FakeTensorMode | None = None,
                cast_cache: CastCache | None = None, opaque_custom_ops: bool = False) -> JointGraph:
    """Trace the graph's function and its backward: `(*primals, *tangents) -> (*outputs, *grads)`.
    `graph_function(copy)`: the function, its written inputs copied by `copy(i, t)`. `cast_cache`: eager's
    autocast cache at the call (autocast_cache.py), None where no autocast region meets the graph.
    `opaque_custom_ops`: the backward of each custom op that opaque_backward.py covers is one call running its
    registered formula."""
    copies = autocast_cache.LeafCopies(cast_cache)
    fn = graph_function(copies)
    mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
    primals = [s.fake(mode, rg) for s, rg in zip(input_specs, requires_grad)]
    diff_outputs = signature.differentiable()
    tangents = [spec.fake(mode) for spec in signature.tangent_specs()]
    n = len(primals)
    grad_mask: list[bool] = []

    def joint(*flat):
        copies.made.clear()
        with opaque_custom_op_backwards() if opaque_custom_ops else contextlib.nullcontext(), \
                autocast_cache.as_eager(cast_cache), eager_formulas():
            outs = fn(*autocast_cache.uncached_inputs(flat[:n], cast_cache))
        wrt = [p for p in flat[:n] if _requires_grad(p)]
        roots, gradients, rest = _at_views(outs, diff_outputs, list(flat[n:]), signature.gradients_at_views)
        outs = [o._base if i in signature.gradients_at_views else o for i, o in enumerate(outs)]
        targets = wrt + list(copies.made.values())
        # eager runs backward outside the autocast region; the engine runs it as is, not through compiled
        # autograd, whose tracer cannot nest inside this one
        with torch._C._DisableAutocast(), compiled_autograd.disable():
            grads = torch.autograd.grad(roots, targets, gradients, allow_unused=True, retain_graph=bool(rest))
            if rest:
                more = torch.autograd.grad([b for b, _ in rest], targets, [g for _, g in rest], allow_unused=True)
                grads = [_sum(a, b) for a, b in zip(grads, more)]
        by_input = iter(grads[:len(wrt)])
        full = copies.route([next(by_input) if _requires_grad(p) else None for p in flat[:n]], grads[len(wrt):])
        grad_mask[:] = [g is not None for g in full]
        return [*outs, *[g for g in full if g is not None]]

    with mode, symbolic_dispatch(mode), torch.enable_grad(), lazily_built():
        gm = make_fx(joint, decomposition_table=decompositions)(*primals, *tangents)
    autocast_cache.drop_aliases(gm, primals, cast_cache)
    return JointGraph(gm, n, len(tangents), len(signature.graph_outputs), grad_mask)


def _at_views(outs: list, diff_outputs: list[int], tangents: list,
              at_views: tuple[int, ...]) -> tuple[list, list, list]:
    """The tensors the backward starts from, with their gradients: each differentiable output with its tangent,
    but for an output in `at_views` (given as the leaf it is the base of), the leaf, with its gradient read off
    the base's tangent. And (base, the rest of its tangent) per such output: the tangent off the leaf's
    elements, zero unless the caller reached the base itself (`leaf._base`), run through a backward of its own
    and added at the inputs, so that it never meets the leaf's gradient in the base's dtype."""
    roots, gradients, rest = [], [], []
    for i, g in zip(diff_outputs, tangents):
        roots.append(outs[i])
        if i not in at_views:
            gradients.append(g)
            continue
        gradients.append(gradient_at_view(g, outs[i]))
        rest.append((outs[i]._base, gradient_off_view(g, outs[i])))
    return roots, gradients, rest


def _sum(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return a if b is None else b if a is None else a + b


def _requires_grad(primal) -> bool:
    """A primal is a tensor, or an int input (a SymInt), which has no gradient."""
    return isinstance(primal, torch.Tensor) and primal.requires_grad

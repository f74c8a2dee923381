"""Running compiled ATen graphs as the captured graph would run.

Training: a `torch.autograd.Function` per compiled graph. Its forward runs the
compiled forward graph and saves the tensors the partitioner chose; its backward
runs the compiled backward graph on them and the incoming gradients. Autograd
then sees the compiled region as one node, and gradient accumulation behaves as
for any custom Function. Where eager's many nodes differ from one, the node
follows eager: a backward frees only the saved tensors of the outputs it ran
(saved_parts.py), and hooks of tensors it hands no gradient do not run
(gradient_hooks.py). Inference runs the forward-only graph and saves nothing.

Both paths then finish the call as eager would have: mutated inputs receive
their new values (`copy_`; outside autograd for inputs that do not require grad,
recorded by autograd for those that do), outputs that alias an input are rebuilt
as real views of it, and the output structure is restored.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from kiln.autograd.absent_tangents import BackwardVariants
from kiln.autograd.functionalize import InputMutation
from kiln.autograd.gradient_hooks import hook_only_gradients, hook_only_gradients_upstream
from kiln.autograd.saved_parts import HeldSaved, saved_parts
from kiln.autograd.saved_versions import SavedByEager, VersionWatch, arm_pending
from kiln.autograd.second_order import InputKeeper, saved_with_history
from kiln.autograd.signature import FlatProgram, OutputSignature, TensorSpec

DOUBLE_BACKWARD_ERROR = (
    b"kiln: double backward (differentiating the gradient of a compiled graph, e.g. "
    b"torch.autograd.grad(..., create_graph=True) then backward again) is not supported; "
    b"run that part eagerly (kiln.disable) or use backend='eager'")


def boxed(compiled: Callable) -> Callable[[list], Any]:
    """The compiled graph as a function of one list of inputs, which it may empty.

    The boxed convention (torch's, too) lets a graph drop each input after its last use:
    with positional arguments the caller's tuple keeps every input alive until the end.
    A compiler opts in with `_boxed_call = True` or a `boxed_call(args)` method (kiln's CompiledGraph); other
    callables get their inputs spread.
    Autocast is off while the graph runs: its casts were traced into the graph.
    """
    call = getattr(compiled, "boxed_call", None) or (
        compiled if getattr(compiled, "_boxed_call", False) else (lambda args: compiled(*args)))

    def run(args: list):
        if torch._C._is_any_autocast_enabled():
            with torch._C._DisableAutocast():
                return call(args)
        return call(args)

    return run


def restride_inputs(signature: OutputSignature, flat: list) -> None:
    """Give the inputs an in-place view op changed (`t_`) their new geometry, before their data is written.

    An input that requires grad is restrided under autograd, which records the view on its history as
    eager's `t_` does (and, for a leaf, raises eager's error); the others outside it."""
    for i, (shape, stride, offset_change) in signature.restrided_inputs:
        with contextlib.nullcontext() if flat[i].requires_grad else torch.no_grad():
            flat[i].as_strided_(shape, stride, flat[i].storage_offset() + offset_change)


class MutationWriter:
    """Writes the new values of mutated inputs into the real inputs, as eager's in-place ops did: those the
    compiled graph did not write there itself (kiln/schedule/input_writes.py; its output is then the input).

    One `_foreach_copy_` per dtype and device of the targets (grouped once, from the traced
    specs), unless two targets share storage: the fused copy runs them in parallel, so those are
    copied one by one, in order. ATen's fused copy is one multi-tensor kernel only when its lists
    hold one dtype; a mixed list (batch norms' float statistics and int64 counters) is a copy per
    tensor, one memcpy launch each per training step. Writes no version counter saw (through `.data`,
    OutputSignature.unversioned_inputs: a batch norm's running statistics) are written so again, through `.data`
    (a version counter of its own, which the write moves): a ResNet's 53 batch norms take one fused copy a step,
    not 106."""

    def __init__(self, mutations: list[InputMutation], input_specs: list[TensorSpec],
                 unversioned: tuple[int, ...] = ()):
        self.writes = [_CopyBack([m for m in mutations if m.input_index in unversioned], input_specs, _data),
                       _CopyBack([m for m in mutations if m.input_index not in unversioned], input_specs, _itself)]

    def __call__(self, flat: list, outs: list) -> None:
        for write in self.writes:
            if write.mutations:
                write(flat, outs)


class _CopyBack:
    """One kind of write of `MutationWriter`: the new values copied into `target(input)` (the input, or its
    `.data`), except those the graph wrote into the input itself, having moved its version counter as eager's
    in-place op moves it (kiln/codegen/wrapper.py)."""

    def __init__(self, mutations: list[InputMutation], input_specs: list[TensorSpec], target: Callable):
        self.mutations, self.target = mutations, target
        self.groups = _by_dtype_and_device(mutations, input_specs)

    def __call__(self, flat: list, outs: list) -> None:
        pending = [m for m in self.mutations if outs[m.output_index] is not flat[m.input_index]]
        if not pending:
            return
        target = self.target
        with torch.no_grad():
            if len(pending) == len(self.mutations) > 1 and _distinct_storages(flat, pending) \
                    and not any(_same_storage(flat[m.input_index], outs[m.output_index]) for m in pending):
                for targets, values in self.groups:
                    torch._foreach_copy_([target(flat[i]) for i in targets], [outs[j] for j in values])
                return
            for m in pending:
                value = outs[m.output_index]
                if _same_storage(flat[m.input_index], value):
                    # the graph returned the input itself, viewed, as its new value (a write of the input with
                    # its own elements, `t.copy_(t)`): ATen refuses a copy between overlapping views
                    value = value.clone()
                target(flat[m.input_index]).copy_(value)


def _itself(t: torch.Tensor) -> torch.Tensor:
    return t


def _data(t: torch.Tensor) -> torch.Tensor:
    return t.data


def _by_dtype_and_device(mutations: list[InputMutation], input_specs: list[TensorSpec]) -> list[tuple[list, list]]:
    """(input indices, output indices) of `mutations` per dtype and device of their inputs, in order: the lists of
    one `_foreach_copy_` (a multi-tensor kernel only where its lists hold one dtype)."""
    groups: dict = {}
    for m in mutations:
        spec = input_specs[m.input_index]
        groups.setdefault((spec.dtype, spec.device), []).append(m)
    return [([m.input_index for m in g], [m.output_index for m in g]) for g in groups.values()]


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _distinct_storages(flat: list, mutations: list[InputMutation]) -> bool:
    return len({flat[m.input_index].untyped_storage().data_ptr() for m in mutations}) == len(mutations)


class InferenceRunner:
    """The forward-only graph: no autograd node, nothing saved for a backward."""

    def __init__(self, program: FlatProgram, signature: OutputSignature, compiled: Callable,
                 mutations: list[InputMutation]):
        self.program, self.signature, self.compiled = program, signature, boxed(compiled)
        self.mutations = mutations
        self.write_mutations = MutationWriter(mutations, program.input_specs, signature.unversioned_inputs)
        self.plain = None if mutations else signature.plain_outputs()

    def with_signature(self, signature: OutputSignature) -> InferenceRunner:
        """The same graph, its outputs assembled by `signature` (of a call in grad mode whose outputs
        need no gradient: the same graph outputs, aliases rebuilt with history where eager's have it)."""
        runner = copy.copy(self)
        runner.signature, runner.plain = signature, None if self.mutations else signature.plain_outputs()
        return runner

    def __call__(self, flat: list) -> Any:
        if torch.is_grad_enabled():  # no output is differentiable: an eagerly run graph (aot_eager) must record
            with torch.no_grad():  # no autograd history (the ops of a `no_grad` block in it would require grad)
                outs = self.compiled(list(flat))
        else:
            outs = self.compiled(list(flat))
        if self.plain is not None:  # the graph's outputs are the result as they are
            return outs[0] if self.plain == "single" else tuple(outs)
        outs = list(outs)
        restride_inputs(self.signature, flat)
        self.write_mutations(flat, outs)
        return self.program.assemble(self.signature, flat, outs)


class TrainingRunner:
    """The forward and backward graphs behind one `torch.autograd.Function`."""

    def __init__(self, program: FlatProgram, signature: OutputSignature, forward: Callable,
                 backward: BackwardVariants, mutations: list[InputMutation], saved_is_size: list[bool],
                 grad_mask: list[bool], snapshots: list[bool], watched: list[SavedByEager], watch_only: list[bool],
                 saved_returned: list[tuple[int, int]], saved_primals: list[int | None], unreached: list[int] = (),
                 origin: str = "a compiled graph", rerun: torch.fx.GraphModule | None = None,
                 viewed_outputs: tuple[int, ...] = ()):
        self.program, self.signature = program, signature
        # inputs that require grad but no output's gradient reaches (`t.detach()` inside): the Function gets
        # them detached, so that it has no edge to their history (a graph already run backward and freed, which
        # the engine would otherwise visit), as eager's ops have none
        self.unreached = unreached
        self.write_mutations = MutationWriter(mutations, program.input_specs, signature.unversioned_inputs)
        self.function = _make_function(forward, backward, len(signature.graph_outputs), saved_is_size,
                                       signature, grad_mask, snapshots, watched, watch_only, saved_returned,
                                       saved_primals, origin, rerun,
                                       InputKeeper(program.parameters) if rerun is not None else None, viewed_outputs)
        differentiable = signature.differentiable()
        self.shared_node_outputs = differentiable if len(differentiable) > 1 else []
        self.partly_reached = _partly_reached(_reached_by(signature, grad_mask), len(differentiable))

    def __call__(self, flat: list) -> Any:
        args = flat
        if self.unreached:
            args = list(flat)
            for i in self.unreached:
                args[i] = args[i].detach()
        outs = list(self.function.call(*args))
        for i in self.shared_node_outputs:
            hook_only_gradients(outs[i])
        for i in self.partly_reached:
            hook_only_gradients_upstream(flat[i])
        restride_inputs(self.signature, flat)
        self.write_mutations(flat, outs)
        for i, j in self.signature.mutated_grad_inputs:  # recorded by autograd, as eager's in-place op was
            with contextlib.nullcontext() if self.signature.requires_grad[j] else torch.no_grad():
                flat[i].copy_(outs[j])
        arm_pending()
        return self.program.assemble(self.signature, flat, outs)


def _partly_reached(reached_by: list[frozenset[int]] | None, num_differentiable: int) -> list[int]:
    """The inputs that get a gradient from some differentiable outputs but not all: a backward through the
    others gives them None (`_drop_unreached`)."""
    if reached_by is None:
        return []
    every = frozenset(range(num_differentiable))
    return [i for i, outputs in enumerate(reached_by) if outputs and outputs != every]


def _make_function(forward: Callable, backward_for: BackwardVariants, num_outputs: int, saved_is_size: list[bool],
                   signature: OutputSignature, grad_mask: list[bool], snapshots: list[bool],
                   watched: list[SavedByEager], watch_only: list[bool], saved_returned: list[tuple[int, int]],
                   saved_primals: list[int | None], origin: str, rerun: torch.fx.GraphModule | None = None,
                   keeper: InputKeeper | None = None, viewed_outputs: tuple[int, ...] = ()) -> type:
    """A `torch.autograd.Function` class bound to one pair of compiled graphs.

    Saved tensors go through `save_for_backward`, so autograd's version check applies: an
    input saved and then mutated in place raises at backward, as it does in eager. Saved
    sizes (the ints a dynamic-shape backward needs) are kept on the context as they are.

    `snapshots`, per saved value: it is (a view of) an input that the runtime writes once the forward
    graph ran (the graph's own in-place op on it, made functional). The backward needs the value the
    graph read, not the input's new one, and eager's version check does not apply (eager saved a value
    computed from the input, or the trace raised): such values are saved as copies.

    `watched`: the inputs and outputs whose values eager's backward saves; their versions are taken
    at the forward and checked by the backward, as eager's are (`saved_versions`). `watch_only`, per saved
    value: it shares the storage of a watched tensor, so the watch alone checks its version: it is saved as
    its `.data` (its own version counter) where it carries no history, since autograd's check would raise at any
    backward through the graph, where eager's raises only for a gradient that reaches the node that saved it.
    `saved_returned`: (saved value, output) pairs where the value saved is that output as returned.

    `saved_primals`, per saved value: the forward input it is, or None (a value the forward computed,
    or a size). A backward run with create_graph=True is differentiated by running its graph's ATen ops
    under autograd, where that is exact (`_differentiable_saves`), or, with `rerun` (the forward graph), where its
    saved values computed again from the call's inputs (those `keeper` keeps) under autograd carry their history
    (second_order.py);
    otherwise its gradients raise a clear error when differentiated.

    `origin`: the user's code the graph holds, named when a second backward finds the saved tensors freed.

    `viewed_outputs`: the outputs the forward graph computes as views of its own values (`unsqueeze_` of an
    intermediate, made functional). Each is returned detached (its storage shared, no view recorded): returned
    as a view, autograd would mark it one made inside a custom Function and refuse an in-place write through it
    (`t1[0].zero_()` after a graph break), where eager's tensor is no view. Kiln's code generator returns them so
    itself (codegen/wrapper.py); graphs run op by op (aot_eager) do not.
    """
    differentiable = signature.differentiable()
    # (output index, traced spec, whether its sizes are symbolic), decided once, not per backward
    tangents = [(i, spec, spec.symbolic) for i, spec in zip(differentiable, signature.tangent_specs())]
    symbolic_tangents = any(symbolic for _, _, symbolic in tangents)
    reached_by = _reached_by(signature, grad_mask)
    forward = boxed(forward)
    num_saved, has_sizes = len(saved_is_size), any(saved_is_size)
    parts = saved_parts(backward_for.graph, saved_is_size, len(tangents))
    snapshot = [k for k, copy in enumerate(snapshots) if copy]
    unchecked = [k for k, only in enumerate(watch_only) if only]

    def recomputed_with_history(ctx, args: list) -> bool:
        """Replace the saved values in `args` by the forward graph's, run again under autograd on the call's inputs
        (second_order.py), where it can be; whether they were."""
        inputs = ctx.call_inputs.as_they_were() if rerun is not None else None
        if inputs is None:
            return False
        args[:num_saved] = saved_with_history(rerun, inputs, num_saved)
        return True

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *flat):
            results = list(forward(list(flat)))
            saved = results[len(results) - num_saved:] if num_saved else []
            outs = results[:len(results) - num_saved]
            for k in viewed_outputs:
                outs[k] = outs[k].detach()
            for k in snapshot:
                saved[k] = saved[k].clone()
            for k, j in saved_returned:
                saved[k] = outs[j]
            for k in unchecked:
                if not saved[k].requires_grad:  # an input with history stays itself (a double backward reads it)
                    saved[k] = saved[k].data
            if has_sizes:
                ctx.saved_sizes = [v for v, size in zip(saved, saved_is_size) if size]
                saved = [v for v, size in zip(saved, saved_is_size) if not size]
            ctx.save_for_backward(*saved)
            if parts is not None:
                ctx.held = HeldSaved(parts, saved)
            ctx.mark_non_differentiable(*[o for i, o in enumerate(outs)
                                          if i >= num_outputs or not signature.requires_grad[i]])
            # Autograd would fill a zero gradient for every output the loss does not reach, the
            # non-differentiable ones included (every batch norm's running statistics: one fill each
            # per step); the backward makes zeros only for the differentiable outputs it reads.
            ctx.set_materialize_grads(False)
            if symbolic_tangents:
                ctx.tangent_shapes = [outs[i].shape for i in differentiable]
            if watched:
                ctx.versions = VersionWatch(watched, flat, outs)
            if rerun is not None:
                ctx.call_inputs = keeper.keep(flat)
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grad_outputs):
            if all(g is None for g in grad_outputs):  # reached through an input edge alone (a later graph wrote
                return (None,) * len(grad_mask)       # this output in place): eager's formulas give no gradient
            if watched:
                ctx.versions.check([grad_outputs[i] is not None for i, _, _ in tangents])
            if parts is None:
                args = _saved_tensors(ctx, len(differentiable), origin)
            else:
                args = ctx.held.take([k for k, (i, _, _) in enumerate(tangents) if grad_outputs[i] is not None],
                                     lambda: _saved_tensors(ctx, len(differentiable), origin))
            if has_sizes:
                tensors, sizes = iter(args), iter(ctx.saved_sizes)
                args = [next(sizes) if size else next(tensors) for size in saved_is_size]
            # Unless the graph is retained, autograd's references to the saved tensors go now, so
            # that a boxed backward can free each one after its last use, as eager's nodes do.
            ctx.maybe_clear_saved_tensors()
            args += [_as_traced(grad_outputs[i], spec, symbolic) if grad_outputs[i] is not None
                     else _zero_gradient(ctx, k, spec, symbolic) for k, (i, spec, symbolic) in enumerate(tangents)]
            absent = frozenset(k for k, (i, _, _) in enumerate(tangents) if grad_outputs[i] is None)
            backward = backward_for(absent)  # eager runs no backward formula of an output the loss skips
            # Grad mode is on in a backward exactly when it runs with create_graph=True.
            differentiating_twice = torch.is_grad_enabled()
            if differentiating_twice and (_differentiable_saves(args, saved_primals, snapshot, grad_mask)
                                          or recomputed_with_history(ctx, args)):
                grads = iter(torch.fx.Interpreter(backward_for.graph_for(absent)).run(*args))
                differentiating_twice = False  # autograd recorded the ops: their gradients are eager's
            else:
                with torch.no_grad():
                    grads = iter(backward(args))
            result = [next(grads) if has_grad else None for has_grad in grad_mask]
            if reached_by is not None:
                _drop_unreached(result, reached_by, [grad_outputs[i] is None for i, _, _ in tangents])
            if differentiating_twice:
                return _delay_error(result)
            return tuple(result)

    def traced_backward(saved: list, grad_outputs: tuple, run_graph: Callable | None = None) -> tuple | None:
        """The backward as the ATen ops of its graph, run on `saved` and `grad_outputs` as they are: under
        compiled autograd's tracer (fake values) the ops land in the captured backward graph, which then
        fuses across this graph's backward and its neighbours'. `run_graph(gm, args) -> outputs` runs the
        graph (the tracer's copies its nodes; an interpreter by default). None where only the compiled
        backward applies: saved sizes (values of this forward the captured graph would bake in), symbolic
        tangents, or a backward that is itself differentiated. The version check of what eager would have
        saved (`ctx.versions`) is the caller's to run before the graph, with the present tangents."""
        if has_sizes or symbolic_tangents or torch.is_grad_enabled():
            return None
        args = [*saved]
        args += [_as_traced(grad_outputs[i], spec, False) if grad_outputs[i] is not None
                 else _zero_gradient(None, k, spec, False) for k, (i, spec, _) in enumerate(tangents)]
        absent = frozenset(k for k, (i, _, _) in enumerate(tangents) if grad_outputs[i] is None)
        graph = backward_for.graph_for(absent)
        grads = iter(run_graph(graph, args) if run_graph is not None else torch.fx.Interpreter(graph).run(*args))
        result = [next(grads) if has_grad else None for has_grad in grad_mask]
        if reached_by is not None:
            _drop_unreached(result, reached_by, [grad_outputs[i] is None for i, _, _ in tangents])
        return tuple(result)

    CompiledFunction.call = _fast_apply(CompiledFunction)
    CompiledFunction.traced_backward = staticmethod(traced_backward)
    CompiledFunction.tangent_outputs = tuple(i for i, _, _ in tangents)  # which grad_outputs the check reads
    return CompiledFunction


def _saved_tensors(ctx, num_differentiable: int, origin: str) -> list:
    """The tensors the forward saved; where autograd refuses them, its error with what it means here.

    An input saved to recompute from (eager saves the value computed from it) and written in place since fails
    autograd's version check where eager's backward runs, as under torch.compile. And a backward through one
    output (`loss.backward()` in the compiled function) frees what a later backward through another output needs
    where their gradients meet at an op that reads a saved value (saved_parts.py holds the rest per part), as
    eager's node of that op is freed."""
    try:
        return [*ctx.saved_tensors]
    except RuntimeError as e:
        if "modified by an inplace operation" in str(e):  # what eager saves was checked first (ctx.versions)
            raise RuntimeError(
                f"{e}\nkiln: the compiled graph of {origin} saved a tensor it reads or returns, to recompute a value "
                "from it in the backward where eager saves the value itself (torch.compile's partitioner does the "
                "same), and that tensor was written in place since. Write into a clone of it, or after the backward."
            ) from None
        if num_differentiable < 2:
            raise
        raise RuntimeError(
            f"{e}\nkiln: this backward goes through the compiled graph of {origin}. Its {num_differentiable} "
            "outputs that require grad meet in its backward at an op that reads a saved value, and an earlier "
            "backward through one of them freed the values that op needs. Pass retain_graph=True to the earlier "
            "backward(), or compute the outputs used after it once it has run.") from None


def _differentiable_saves(saved: list, saved_primals: list[int | None], snapshot: list[int],
                          grad_mask: list[bool]) -> bool:
    """Whether the backward graph run under autograd on `saved` differentiates as eager's backward does: every
    saved tensor is a forward input as the caller passed it, with its history (`x ** 3`'s backward reads x).
    A value the forward computed (or copied: a snapshot, an input given other strides) has no history, and
    the gradients through it would be silently missing."""
    for k, (value, primal) in enumerate(zip(saved, saved_primals)):
        if not isinstance(value, torch.Tensor):
            continue  # a size
        if primal is None or k in snapshot or (grad_mask[primal] and not value.requires_grad):
            return False
    return True


def _reached_by(signature: OutputSignature, grad_mask: list[bool]) -> list[frozenset[int]] | None:
    """Per flat input that gets a gradient, the differentiable outputs (by tangent position) reaching it."""
    if signature.reaches is None:
        return None
    return [frozenset(k for k, reach in enumerate(signature.reaches) if i in reach) if has_grad else frozenset()
            for i, has_grad in enumerate(grad_mask)]


def _drop_unreached(result: list, reached_by: list[frozenset[int]], absent: list[bool]) -> None:
    """None, not the zeros the graph computed, for inputs that only outputs without a gradient reach:
    eager's backward never visits them, and leaves their `.grad` None."""
    if not any(absent):
        return
    missing = {k for k, gone in enumerate(absent) if gone}
    for i, outputs in enumerate(reached_by):
        if result[i] is not None and outputs <= missing:
            result[i] = None


def _fast_apply(function: type) -> Callable:
    """`function.apply`, without `torch.autograd.Function.apply`'s Python layer when it has nothing to do.

    That layer unwraps functorch wrappers and checks `setup_context`: about 5 us a call.
    With no functorch transform active and no `setup_context`, the C++ apply beneath it
    does the same work.
    """
    base_apply = super(torch.autograd.Function, function).apply
    apply = function.apply
    transforms_active = torch._C._are_functorch_transforms_active

    def call(*args):
        return apply(*args) if transforms_active() else base_apply(*args)

    return call


def _as_traced(grad: torch.Tensor, spec: TensorSpec, symbolic: bool) -> torch.Tensor:
    """The incoming gradient with the strides the backward graph was traced with.

    Autograd may hand in an expanded or transposed gradient (`loss.sum()` gives a
    stride-0 one); compiled kernels index with the traced strides, so copy if they differ.
    A dynamic-shape backward is traced with contiguous gradients (`tangent_specs`).
    """
    if symbolic:
        return grad.contiguous()
    if tuple(grad.stride()) == spec.stride or grad.numel() <= 1:
        return grad
    return torch.empty_strided(spec.shape, spec.stride, dtype=grad.dtype, device=grad.device).copy_(grad)


def _zero_gradient(ctx, k: int, spec: TensorSpec, symbolic: bool) -> torch.Tensor:
    """The zero gradient of differentiable output `k`, which the loss did not reach (autograd passed None)."""
    if symbolic:
        return torch.zeros(ctx.tangent_shapes[k], dtype=spec.dtype, device=spec.device)
    return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=spec.device).zero_()


def _delay_error(grads: list) -> tuple:
    """Gradients that raise a clear error if anything differentiates through them again."""
    present = [g for g in grads if g is not None]
    err = torch._C._functions.DelayedError(DOUBLE_BACKWARD_ERROR, len(present))
    wrapped = err(*[g.detach().requires_grad_(True) for g in present])
    wrapped = iter((wrapped,) if isinstance(wrapped, torch.Tensor) else wrapped)
    return tuple(next(wrapped) if g is not None else None for g in grads)

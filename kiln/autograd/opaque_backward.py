"""The backward of a custom operator (`torch.library.custom_op`) kept as one opaque call in the joint graph.

A custom op's registered autograd formula (`register_autograd(backward, setup_context=...)`) is Python that
tracing normally runs on fake tensors, so its ATen ops join the backward graph. Some formulas read tensor data
to decide what to compute: transformers' grouped matmul of mixture-of-experts layers loops over
`ctx.offs.tolist()` (the tokens per expert), which no fake tensor can answer (`DataDependentOutputException`).
Eager's autograd runs such a formula on real tensors, and so can the compiled backward: where the joint trace
hits a data-dependent value, it is traced again with each custom op's backward as one call of
`kiln::custom_op_backward`, which at run time replays the op's `setup_context` on the values the forward graph
saved (the op's inputs and outputs) and runs its registered `backward` on them, as eager's autograd does. The
forward op itself stays in the graph as it was (an extern with its fake implementation's sizes).

Covered: ops defined with `torch.library.custom_op` (whose formula kiln can find), with arguments that are
tensors or constants (numbers, strings, booleans, None, dtypes, devices, lists of them) and tensor results.
Others (tensor-list arguments, symbolic sizes among the arguments, ops registered through `Library.define`)
keep the traced formula, and a graph whose formula needs tensor data still runs op by op (a counted fallback).
A formula that returns None for an input that requires grad gives zeros here (the compiled backward returns
a tensor for every input the trace saw requiring grad), where eager leaves that input's `.grad` None if no
other path reaches it.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import torch
from torch._library.custom_ops import OPDEFS, CustomOpDef
from torch._library.utils import fill_defaults
from torch.overrides import TorchFunctionMode

_LIBRARY = torch.library.Library("kiln", "FRAGMENT")
_LIBRARY.define("custom_op_backward(str op, str call, Tensor[] tensors, Tensor[] outputs, Tensor[] grads, "
                "int[] grad_inputs) -> Tensor[]")


def _encode(value):
    """A constant argument as JSON (a dtype or device as a one-key object); TypeError for any other value."""
    if value is None or isinstance(value, (bool, int, float, str)):  # a SymInt is none of these
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    raise TypeError(f"argument of type {type(value).__name__}")


def _decode(value):
    if isinstance(value, dict):
        return getattr(torch, value["dtype"]) if "dtype" in value else torch.device(value["device"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def encode_call(args: Sequence, kwargs: dict) -> tuple[str, list]:
    """(a call's arguments as JSON, a tensor as {"tensor": k}; its tensors, in order). TypeError where an
    argument is neither a tensor nor a constant `_encode` knows (a list of tensors, a SymInt)."""
    tensors, encoded = [], []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            encoded.append({"tensor": len(tensors)})
            tensors.append(arg)
        else:
            encoded.append(_encode(arg))
    return json.dumps({"args": encoded, "kwargs": {k: _encode(v) for k, v in kwargs.items()}}), tensors


def decode_call(call: str, tensors: Sequence) -> tuple[list, dict]:
    decoded = json.loads(call)
    args = [tensors[a["tensor"]] if isinstance(a, dict) and "tensor" in a else _decode(a) for a in decoded["args"]]
    return args, {k: _decode(v) for k, v in decoded["kwargs"].items()}


class _Replay(torch.autograd.Function):
    """The op's registered autograd formula over its saved inputs and outputs: `forward` returns the outputs
    the compiled forward computed (the op does not run again) after the op's `setup_context` saw them,
    `backward` is the op's registered `backward`. The last argument (the op's definition, its outputs and
    keyword-only arguments) needs no gradient: it is hidden from `needs_input_grad`, as torch's own wrapper of
    these formulas (torch/_library/autograd.py) hides its metadata argument."""

    @staticmethod
    def forward(ctx, *args):
        definition, outputs, kwargs = args[-1]
        schema = definition._opoverload._schema
        # setup_context sees every argument, defaults included, as under eager's autograd (the call passes
        # fewer: `needs_input_grad` has an entry per argument passed)
        args, kwargs = fill_defaults(schema, args[:-1], kwargs)
        result = tuple(t.detach() for t in outputs)  # new tensors: autograd gives them this node's history
        result = result[0] if len(result) == 1 else result
        ctx.kiln_definition = definition
        if any(a.kwarg_only for a in schema.arguments):
            definition._setup_context_fn(ctx=ctx, inputs=args, keyword_only_inputs=kwargs, output=result)
        else:
            definition._setup_context_fn(ctx=ctx, inputs=args, output=result)
        return result

    @staticmethod
    def backward(ctx, *grads):
        needs_input_grad = ctx.needs_input_grad
        ctx.needs_input_grad = needs_input_grad[:-1]
        try:
            result = ctx.kiln_definition._backward_fn(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs_input_grad
        return (*result, None) if isinstance(result, tuple) else (result, None)


def _custom_op_backward(op: str, call: str, tensors: list, outputs: list, grads: list,
                        grad_inputs: list[int]) -> list[torch.Tensor]:
    """The gradients of the tensor arguments `grad_inputs` (positions in `tensors`), as eager's autograd computes
    them through the op's registered formula; in the layout of the arguments (the fake implementation's)."""
    wrt = {k: tensors[k].detach().requires_grad_() for k in grad_inputs}
    args, kwargs = decode_call(call, [wrt.get(k, t) for k, t in enumerate(tensors)])
    with torch.enable_grad():
        replayed = _Replay.apply(*args, (OPDEFS[op], outputs, kwargs))
        replayed = replayed if isinstance(replayed, tuple) else (replayed,)
        # outputs autograd does not differentiate (integer results, marked non-differentiable) take no gradient
        pairs = [(out, grad) for out, grad in zip(replayed, grads) if out.requires_grad]
        found = torch.autograd.grad([out for out, _ in pairs], list(wrt.values()), [grad for _, grad in pairs],
                                    allow_unused=True)
    return [_like(g, tensors[k]) for g, k in zip(found, grad_inputs)]


def _like(grad: torch.Tensor | None, argument: torch.Tensor) -> torch.Tensor:
    """`grad` in `argument`'s layout (the fake implementation's result; autograd already matched its sizes and
    dtype); zeros for a gradient the formula left out (None)."""
    out = torch.empty_like(argument)
    if grad is None:
        return out.zero_()
    return grad if grad.stride() == out.stride() else out.copy_(grad)


def _gradients_like(op, call, tensors, outputs, grads, grad_inputs) -> list[torch.Tensor]:
    return [torch.empty_like(tensors[k]) for k in grad_inputs]


_LIBRARY.impl("custom_op_backward", _custom_op_backward, "CompositeExplicitAutograd")
torch.library.register_fake("kiln::custom_op_backward", _gradients_like, lib=_LIBRARY)


class _OpaqueBackward(torch.autograd.Function):
    """While tracing: the op's forward as itself (below autograd: its fake implementation), and its backward
    as one `kiln::custom_op_backward` call over the op's tensor arguments and outputs, saved for it."""

    @staticmethod
    def forward(ctx, op, kwargs, *args):
        result = op(*args, **kwargs)
        call, tensors = encode_call(args, kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        ctx.save_for_backward(*tensors, *outputs)
        ctx.op, ctx.call, ctx.num_tensors = op, call, len(tensors)
        ctx.tensor_positions = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
        return result

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        tensors, outputs = list(saved[:ctx.num_tensors]), list(saved[ctx.num_tensors:])
        needs = ctx.needs_input_grad[2:]
        grad_inputs = [k for k, position in enumerate(ctx.tensor_positions) if needs[position]]
        found = torch.ops.kiln.custom_op_backward(ctx.op._schema.name, ctx.call, tensors, outputs, list(grads),
                                                  grad_inputs)
        at_position = {ctx.tensor_positions[k]: grad for k, grad in zip(grad_inputs, found)}
        return None, None, *(at_position.get(p) for p in range(len(needs)))


def _definition(func) -> CustomOpDef | None:
    """The `custom_op` definition of `func` (an op or its packet) if it has a registered backward, else None."""
    op = func.default if isinstance(func, torch._ops.OpOverloadPacket) and func.overloads() == ["default"] else func
    if not isinstance(op, torch._ops.OpOverload):
        return None
    definition = OPDEFS.get(op._schema.name)
    return definition if definition is not None and definition._backward_fn is not None else None


def calls_custom_ops(gm: torch.fx.GraphModule) -> bool:
    """Does the captured graph call a custom op with a registered backward (one that may be made opaque)?"""
    return any(node.op == "call_function" and _definition(node.target) is not None for node in gm.graph.nodes)


def _opaque_call(func, args: tuple, kwargs: dict):
    """`func(*args, **kwargs)` as `_OpaqueBackward` if `func` is a custom op this module covers and some
    argument requires grad; else None."""
    definition = _definition(func)
    if definition is None or not torch.is_grad_enabled():
        return None
    op = definition._opoverload
    schema = op._schema
    if not schema.returns or not all(isinstance(r.type, torch.TensorType) for r in schema.returns):
        return None
    bound = _as_dispatched(schema, args, kwargs)
    if bound is None or not any(isinstance(a, torch.Tensor) and a.requires_grad for a in bound[0]):
        return None
    try:
        encode_call(*bound)
    except TypeError:
        return None
    return _OpaqueBackward.apply(op, bound[1], *bound[0])


def _as_dispatched(schema, args: tuple, kwargs: dict) -> tuple[list, dict] | None:
    """(the positional arguments, the keyword-only ones) of a call as the dispatcher hands them to the op's
    autograd kernel: positional arguments given by name moved to their place, trailing ones equal to their
    default left out (eager's `needs_input_grad` has no entry for those), keyword-only ones with their
    defaults. None where the call does not match the schema (the op then raises its own error, traced as it
    is)."""
    positional, keyword, unbound = [], {}, dict(kwargs)
    for k, argument in enumerate(schema.arguments):
        if k < len(args) and not argument.kwarg_only:
            value = args[k]
        elif argument.name in unbound:
            value = unbound.pop(argument.name)
        elif argument.has_default_value():
            value = argument.default_value
        else:
            return None
        if argument.kwarg_only:
            keyword[argument.name] = value
        else:
            positional.append(value)
    if unbound or len(args) > len(positional):
        return None
    while positional and _is_default(positional[-1], schema.arguments[len(positional) - 1]):
        positional.pop()
    return positional, keyword


def _is_default(value, argument) -> bool:
    if not argument.has_default_value() or isinstance(value, torch.Tensor):
        return False
    default = argument.default_value
    return value is None if default is None else value == default


class _OpaqueCustomOps(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = _opaque_call(func, args, kwargs)
        return func(*args, **kwargs) if result is None else result


def opaque_custom_op_backwards() -> TorchFunctionMode:
    """A mode within which calls of covered custom ops (see the module's docstring) keep their backward opaque."""
    return _OpaqueCustomOps()

"""Saved values with history, for a compiled backward that is itself differentiated (create_graph=True).

Run with create_graph=True, the runtime runs the backward graph's ATen ops under autograd (runtime.py). That
differentiates as eager does only if every value the backward reads carries its history from the inputs. A
forward input does (as the caller passed it); a value the forward computed and saved does not: the compiled
forward recorded nothing. The partition saves such values wherever eager saves them rather than an input it
would recompute them from (the input may be written before the backward: partition.py `EXPOSED_COST`), so
`((x - w) ** 2).mean()` saves `x - w`, as eager does.

Such a backward gets its saved values again by running the forward graph's ATen ops under autograd on the
inputs of the call, as they were: the inputs are kept from the forward (weakly, but for leaves that require grad,
which the autograd graph holds anyway) with their versions, and the recomputation runs only if each is alive and
unwritten. A forward that draws random numbers (which a second run would draw anew) or has other effects is not
run again: its gradient raises runtime.py's clear error when differentiated, as before.
"""
from __future__ import annotations

import weakref

import torch
import torch.fx as fx

from kiln.effects import has_effect


def forward_to_rerun(forward: fx.GraphModule, saved_primals: list[int | None],
                     saved_is_size: list[bool]) -> fx.GraphModule | None:
    """`forward`, where a differentiated backward may run it again: it saves a tensor that is no input, and it
    has no effect a second run would repeat (a random draw). None otherwise."""
    if all(p is not None or size for p, size in zip(saved_primals, saved_is_size)):
        return None  # the backward reads inputs only: it differentiates as it is
    if any(n.op == "call_function" and has_effect(n) for n in forward.graph.nodes):
        return None
    return forward


class CallInputs:
    """The inputs of one forward call, for a second run of the forward graph on them."""

    def __init__(self, flat: tuple):
        self.refs = [_reference(t) for t in flat]
        self.versions = [t._version if isinstance(t, torch.Tensor) else None for t in flat]

    def as_they_were(self) -> list | None:
        """The inputs, or None if one has been freed or written in place since the forward."""
        inputs = [r() if isinstance(r, weakref.ref) else r for r in self.refs]
        for t, version in zip(inputs, self.versions):
            if version is not None and (t is None or t._version != version):
                return None
        return inputs


def _reference(value):
    """A leaf that requires grad as it is (its gradient accumulator, which the graph holds, holds it); another
    tensor weakly (an activation the backward does not read must not live on for this); a number as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    return value if value.requires_grad and value.is_leaf else weakref.ref(value)


def saved_with_history(forward: fx.GraphModule, inputs: list, num_saved: int) -> list:
    """The values the forward graph saves (its last `num_saved` outputs), computed again from `inputs` under
    autograd, so that each carries its history from them."""
    with torch.enable_grad():
        results = torch.fx.Interpreter(forward).run(*inputs)
    return list(results[len(results) - num_saved:])

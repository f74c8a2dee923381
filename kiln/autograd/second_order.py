"""Saved values with history, for a compiled backward that is itself differentiated (create_graph=True).

Run with create_graph=True, the runtime runs the backward graph's ATen ops under autograd (runtime.py). That
differentiates as eager does only if every value the backward reads carries its history from the inputs. A
forward input does (as the caller passed it); a value the forward computed and saved does not: the compiled
forward recorded nothing. The partition saves such values wherever eager saves them rather than an input it
would recompute them from (the input may be written before the backward: partition.py `EXPOSED_COST`), so
`((x - w) ** 2).mean()` saves `x - w`, as eager does.

Such a backward gets its saved values again by running the forward graph's ATen ops under autograd on the
inputs of the call, as they were: the inputs are kept from the forward (weakly, but for parameters) with their
versions, and the recomputation runs only if each is alive and unwritten (`InputKeeper`). A forward that draws
random numbers (which a second run would draw anew) or has other effects is not run again: its gradient raises
runtime.py's clear error when differentiated, as before.
"""
from __future__ import annotations

import operator
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


class InputKeeper:
    """Which inputs of one graph a call keeps for a second run of its forward, decided once per graph: the
    parameters as they are (their module holds them, and an optimizer's step writes them after the backward, as the
    partition takes them to be), every other tensor weakly, with its version (an activation the backward does not
    read must not live on for this), numbers as they are. Per call it costs a lookup of the parameters and a weak
    reference to each other input."""

    def __init__(self, parameters: tuple[bool, ...]):
        held = [i for i, parameter in enumerate(parameters) if parameter]
        self.others = [i for i, parameter in enumerate(parameters) if not parameter]
        self.order = held + self.others
        self.take_parameters = operator.itemgetter(*held) if len(held) > 1 else (
            (lambda flat: (flat[held[0]],)) if held else (lambda flat: ()))

    def keep(self, flat: tuple) -> CallInputs:
        return CallInputs(self, flat)


class CallInputs:
    """The inputs of one forward call (`InputKeeper`), for a second run of the forward graph on them."""

    def __init__(self, keeper: InputKeeper, flat: tuple):
        self.keeper = keeper
        self.parameters = keeper.take_parameters(flat)
        others = [flat[i] for i in keeper.others]
        self.others = [weakref.ref(t) if isinstance(t, torch.Tensor) else t for t in others]
        # an inference tensor (made under inference_mode) has no version counter: no write to it is seen, as in eager
        self.versions = [t._version if isinstance(t, torch.Tensor) and not t.is_inference() else None for t in others]

    def as_they_were(self) -> list | None:
        """The inputs in order, or None if one that is no parameter was freed or written in place since."""
        others = [r() if isinstance(r, weakref.ref) else r for r in self.others]
        for r, t, version in zip(self.others, others, self.versions):
            if (isinstance(r, weakref.ref) and t is None) or (version is not None and t._version != version):
                return None
        inputs = [None] * len(self.keeper.order)
        for i, value in zip(self.keeper.order, [*self.parameters, *others]):
            inputs[i] = value
        return inputs


def saved_with_history(forward: fx.GraphModule, inputs: list, num_saved: int) -> list:
    """The values the forward graph saves (its last `num_saved` outputs), computed again from `inputs` under
    autograd, so that each carries its history from them."""
    with torch.enable_grad():
        results = torch.fx.Interpreter(forward).run(*inputs)
    return list(results[len(results) - num_saved:])

"""The state an optimizer's first step creates before its update, made ahead of the compiled update.

Adam's and AdamW's first step starts by creating each parameter's state (`_init_group`: a zero step count
and zero moment buffers) and then runs the same update as every later step. Making that state first and
running the steady update over it is that first step, op for op: the first step needs no graph of its
own, and a whole training step compiles one optimizer update instead of two (the first step's, which
returns the state it creates, and the steady one's, which reads it).

Where a first step is not the steady update over some initial state, the first step keeps its own graph
(`kiln.optim.trace`): SGD's first momentum buffer is a copy of the grad, where later steps blend the
grad into the buffer.

The state is made as the traced first step makes it under the trace's settings (the capturable path:
the step count a tensor on the parameter's device, see `kiln.optim.trace`), so the update compiled for
it is the one every later step takes.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.optim.optimizer import _get_scalar_dtype


def _adam_state(group: dict, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """Adam's and AdamW's `_init_group` for one parameter, on the capturable path."""
    state = {"step": torch.zeros((), dtype=_get_scalar_dtype(), device=param.device),
             "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
             "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}
    if group["amsgrad"]:
        state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    return state


# Per optimizer class: (group, parameter) -> the state its first step creates before the update, for a
# parameter whose state is empty. Classes not listed compile their first step as its own graph.
INITIAL_STATE: dict[type, Callable[[dict, torch.Tensor], dict[str, torch.Tensor]]] = {
    torch.optim.Adam: _adam_state,
    torch.optim.AdamW: _adam_state,
}


def create_initial_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter that has a grad and no state yet the state its first step would create (for
    the optimizers of `INITIAL_STATE`; others are left as they are)."""
    make = INITIAL_STATE.get(type(optimizer))
    if make is None:
        return
    state = optimizer.state
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None and not state.get(param):
                state[param] = make(group, param)


def first_step_has_own_graph(optimizer: torch.optim.Optimizer) -> bool:
    """Whether this optimizer's first step compiles a graph of its own (see the module docstring)."""
    return type(optimizer) not in INITIAL_STATE

"""An optimizer's update as one ATen graph over (params, grads, state tensors, learning rates).

The optimizer's own `step` runs once on fake tensors, swapped in for its parameters, grads and state,
under a dispatch-level tracer: what it computes is recorded, in-place writes to parameters and state
included (the backend turns those into writes back into the inputs). It runs with the settings a compiler
gets from torch (`torch.compiler.is_compiling()` true) and three of kiln's:

- the learning rate of each group is a 0-d tensor input, so a scheduler's new value is a new input value
  and not a new graph;
- the foreach implementation, whose tensor-learning-rate path is written for compilers (fused variants
  trace it too: same update, and kiln generates the kernels), with its ops decomposed per tensor;
- Adam's and AdamW's `capturable` path, where the step count and bias corrections stay tensors (the
  non-capturable path reads the step count into Python, a value per step).

A state entry the step sets to a tensor other than the one it was given (the first step creates Adam's
`step`, `exp_avg` and `exp_avg_sq`, SGD's momentum buffer is a copy of the first grad) is an output of the
graph, stored into the optimizer's state after the run: the first step is compiled like the others, and
the state it creates is the one eager's first step creates (with the capturable path's `step` on the
parameter's device, as torch.compile's optimizer keeps it).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.lower.foreach import FOREACH_DECOMPOSITIONS


@dataclass(frozen=True)
class StepLayout:
    """Which tensors the traced step reads, in the order of the graph's inputs."""

    params: tuple  # the parameters with a grad, in group order
    state_keys: tuple  # per parameter, the names of its tensor state entries (sorted)
    group_sizes: tuple  # per group, how many of `params` it holds

    def flat_inputs(self, optimizer: torch.optim.Optimizer, lrs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The graph's inputs now: params, grads, state tensors, learning rates. (The update runs under
        no_grad, where writing a leaf that requires grad in place is allowed.)"""
        params = list(self.params)
        grads = [p.grad for p in self.params]
        states = [optimizer.state[p][k] for p, keys in zip(self.params, self.state_keys) for k in keys]
        return [*params, *grads, *states, *lrs]


def layout_of(optimizer: torch.optim.Optimizer) -> StepLayout:
    params, sizes = [], []
    for group in optimizer.param_groups:
        with_grad = [p for p in group["params"] if p.grad is not None]
        params += with_grad
        sizes.append(len(with_grad))
    keys = tuple(tuple(sorted(k for k, v in optimizer.state[p].items() if isinstance(v, torch.Tensor)))
                 for p in params)
    return StepLayout(tuple(params), keys, tuple(sizes))


def trace_step(optimizer: torch.optim.Optimizer, layout: StepLayout,
               flat: list[torch.Tensor]) -> tuple[torch.fx.GraphModule, tuple[tuple[int, str], ...]]:
    """The ATen graph of one `optimizer.step()` over `flat` (see `StepLayout.flat_inputs`), and the state
    entries its outputs are, in order: (index in `layout.params`, key) (see the module docstring)."""
    step = type(optimizer).step
    step = getattr(step, "__wrapped__", step)  # below torch's profiling/hooks wrapper: hooks run natively
    assigned: list[tuple[int, str]] = []

    def update(*values):
        with _swapped(optimizer, layout, list(values)) as state, _compiling(), torch.no_grad():
            given = {fake: dict(entries) for fake, entries in state.items()}
            step(optimizer)
            assigned[:] = []  # make_fx may call the function more than once
            return list(_new_state(given, state, assigned))

    with torch.no_grad():
        gm = make_fx(update, decomposition_table=FOREACH_DECOMPOSITIONS, tracing_mode="fake")(*flat)
    return gm, tuple(assigned)


def _new_state(given: dict, state: dict, assigned: list) -> Iterator[torch.Tensor]:
    """The state tensors the traced step set, other than the ones it was given, noting (param, key) of each.
    A non-tensor entry it created is not something the graph can return: such a step is not compiled."""
    for index, (entries, before) in enumerate(zip(state.values(), given.values())):
        for key, value in sorted(entries.items()):
            if key in before and value is before[key]:
                continue
            if not isinstance(value, torch.Tensor):
                raise NotImplementedError(f"kiln: optimizer step sets state {key!r} to a {type(value).__name__}")
            assigned.append((index, key))
            yield value


@contextlib.contextmanager
def _swapped(optimizer: torch.optim.Optimizer, layout: StepLayout, values: list) -> Iterator[dict]:
    """The optimizer holding the traced values in place of its own for the length of the block; yields
    its state (by traced parameter), which the step updates."""
    n = len(layout.params)
    params, grads, rest = values[:n], values[n:2 * n], iter(values[2 * n:])
    state = {}
    for fake, grad, real, keys in zip(params, grads, layout.params, layout.state_keys):
        fake.grad = grad
        state[fake] = {**optimizer.state[real], **{k: next(rest) for k in keys}}
    lrs = list(rest)
    saved_groups = [dict(g) for g in optimizer.param_groups]
    saved_state = optimizer.state
    fakes = iter(params)
    try:
        for group, size, lr in zip(optimizer.param_groups, layout.group_sizes, lrs):
            group["params"] = [next(fakes) for _ in range(size)]
            group["lr"] = lr
            group.update({k: v for k, v in _TRACE_SETTINGS.items() if k in group})
        optimizer.state = state
        yield state
    finally:
        for group, saved in zip(optimizer.param_groups, saved_groups):
            group.clear()
            group.update(saved)
        optimizer.state = saved_state


# Group settings for the trace (see the module docstring); set only where the optimizer has them.
_TRACE_SETTINGS = {"foreach": True, "fused": None, "capturable": True, "differentiable": False}


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    """`torch.compiler.is_compiling()` answers True: torch's optimizers then take their compiler paths."""
    prior = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = prior

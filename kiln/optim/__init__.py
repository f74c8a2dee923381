"""Compiled optimizer steps: `optimizer.step()` of SGD, Adam and AdamW as one generated graph.

When a kiln-compiled function calls `optimizer.step()`, capture ends its graph there (a boundary, not a
graph break; see `kiln.capture.routes`) and the output program calls `compiled_step`: the update traced
once per structure (`trace.py`), compiled by the region's backend, and run with the current learning
rates as inputs. The optimizer keeps its own state tensors, updated in place, so `state_dict()` and
`load_state_dict()` work as in eager. What the compiled step does not cover runs the optimizer's own
`step`: the first step (which creates the state), a closure, step hooks, sparse or complex values, other
optimizer classes.
"""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.optim.optimizer as torch_optimizer

from kiln.capture import routes
from kiln.optim.trace import StepLayout, layout_of, trace_step

log = logging.getLogger("kiln.recompiles")
log_hints = logging.getLogger("kiln.perf_hints")

# The state each supported optimizer keeps per parameter, given its group: the entries its first step
# creates. A step that would create them runs eagerly (the update graph is traced with them as inputs).
_ADAM_STATE = lambda group: ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())  # noqa: E731
STATE = {
    torch.optim.SGD: lambda group: ("momentum_buffer",) if group["momentum"] else (),
    torch.optim.Adam: _ADAM_STATE,
    torch.optim.AdamW: _ADAM_STATE,
}
SUPPORTED = tuple(STATE)
_IGNORED_HYPERPARAMETERS = {"params", "lr", "initial_lr"}  # lr is an input; initial_lr is the scheduler's


class CompiledSteps:
    """The compiled updates of one optimizer, by structure, and the learning-rate inputs they read."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer_ref = weakref.ref(optimizer)
        self.entries: dict[tuple, tuple[StepLayout, Callable]] = {}
        self.last_key: tuple | None = None
        self.lrs: list[torch.Tensor] = []

    def run(self, optimizer: torch.optim.Optimizer, backend: Callable) -> None:
        layout = layout_of(optimizer)
        key = (id(backend), _structure_key(optimizer, layout))
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._compile(optimizer, layout, backend)
            if self.last_key is not None:
                log.info("optimizer step of %s recompiles: %s changed", type(optimizer).__name__,
                         _what_changed(self.last_key[1], key[1]))
        self.last_key = key
        layout, compiled = entry
        with torch.no_grad():
            compiled(*layout.flat_inputs(optimizer, self._learning_rates(optimizer)))

    def _learning_rates(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """Per group, its lr as a 0-d tensor: the user's own when it is one, else kiln's, refilled."""
        groups = optimizer.param_groups
        if len(self.lrs) != len(groups):  # on the group's device: the update graph reads no other device
            self.lrs = [torch.zeros((), dtype=torch.float64, device=g["params"][0].device) for g in groups]
        lrs = []
        for group, held in zip(groups, self.lrs):
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):
                lrs.append(lr)
            else:
                held.fill_(lr)
                lrs.append(held)
        return lrs

    def _compile(self, optimizer: torch.optim.Optimizer, layout: StepLayout, backend: Callable):
        flat = layout.flat_inputs(optimizer, self._learning_rates(optimizer))
        gm = trace_step(optimizer, layout, flat)
        with torch.no_grad():
            return layout, backend(gm, flat)


_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_step(optimizer: torch.optim.Optimizer, backend: Callable, *args, **kwargs) -> Any:
    """`optimizer.step(*args, **kwargs)`, through a compiled update where it applies (module docstring)."""
    why = _runs_eagerly(optimizer, args, kwargs)
    if why:
        log_hints.info("optimizer step of %s runs eagerly: %s", type(optimizer).__name__, why)
        return type(optimizer).step(optimizer, *args, **kwargs)
    steps = _steps.get(optimizer)
    if steps is None:
        steps = _steps[optimizer] = CompiledSteps(optimizer)
    steps.run(optimizer, backend)
    optimizer._optimizer_step_code()
    return None


def _runs_eagerly(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> str:
    """Why this step cannot take the compiled update ('' when it can)."""
    if type(optimizer) not in SUPPORTED:
        return f"{type(optimizer).__name__} is not one of {', '.join(c.__name__ for c in SUPPORTED)}"
    if args or kwargs:
        return "step() was given a closure"
    if (optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
            or torch_optimizer._global_optimizer_pre_hooks or torch_optimizer._global_optimizer_post_hooks):
        return "step hooks are registered"
    if any(g.get("differentiable") for g in optimizer.param_groups):
        return "differentiable=True"
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse or p.is_complex():
                return "a sparse grad or complex parameter"
            state = optimizer.state.get(p, {})
            if any(not isinstance(state.get(k), torch.Tensor) for k in STATE[type(optimizer)](group)):
                return "its state is created by this step (the first one)"
    return ""


def _structure_key(optimizer: torch.optim.Optimizer, layout: StepLayout) -> tuple:
    """What a compiled update is specialized to: each parameter (identity, layout, its grad's and state's
    layouts) and each group's hyperparameters other than the learning rate."""
    tensors = tuple(
        (id(p), _meta(p), _meta(p.grad), tuple((k, _meta(optimizer.state[p][k])) for k in keys))
        for p, keys in zip(layout.params, layout.state_keys))
    groups = tuple(tuple(sorted((k, _hashable(v)) for k, v in g.items() if k not in _IGNORED_HYPERPARAMETERS))
                   for g in optimizer.param_groups)
    return (type(optimizer), layout.group_sizes, tensors, groups)


def _meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)


def _hashable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _what_changed(old: tuple, new: tuple) -> str:
    names = ["optimizer class", "parameters per group", "parameter, grad or state layouts", "hyperparameters"]
    return ", ".join(n for n, a, b in zip(names, old, new) if a != b) or "the backend"


def _is_step(fn: Any) -> bool:
    """An optimizer's `step`: torch's profiling wrapper around a class's step (marked `hooked`), or the
    wrapper an LR scheduler puts on the instance."""
    return bool(getattr(fn, "hooked", False) and fn.__name__ == "step") or getattr(fn, "_wrapped_by_lr_sched", False)


def _optimizer_of(fn: Any) -> torch.optim.Optimizer:
    """The optimizer a step call acts on: a bound method's `self`, or the scheduler wrapper's weak ref."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.optim.Optimizer):
        return owner
    for cell in fn.__closure__ or ():
        target = cell.cell_contents
        if isinstance(target, weakref.ref) and isinstance(target(), torch.optim.Optimizer):
            return target()
    raise TypeError(f"kiln: cannot tell which optimizer {fn!r} steps")


def _run_step(ctx: Any, fn: Any, *args, **kwargs) -> Any:
    optimizer = _optimizer_of(fn)
    if getattr(fn, "_wrapped_by_lr_sched", False):
        optimizer._opt_called = True  # what the scheduler's wrapper records, read by its order warning
    return compiled_step(optimizer, ctx.backend, *args, **kwargs)


def _run_zero_grad(ctx: Any, fn: Any, *args, **kwargs) -> Any:
    """`optimizer.zero_grad()` sets (or zeroes) `.grad`s: no computation to compile, it runs as it is
    (captured, it is recorded and made after the graph: the forward does not read grads)."""
    return fn(*args, **kwargs)


routes.register(routes.Route("optimizer", _is_step, _run_step))
routes.register(routes.Route("optimizer", lambda fn: fn is torch.optim.Optimizer.zero_grad, _run_zero_grad,
                             deferred=True))

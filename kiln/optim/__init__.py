"""Compiled optimizer steps: `optimizer.step()` of SGD, Adam and AdamW as one generated graph.

When a kiln-compiled function calls `optimizer.step()`, capture ends its graph there (a boundary, not a
graph break; see `kiln.capture.routes`) and the output program calls `compiled_step`: the update traced
once per structure (`trace.py`), compiled by the region's backend, and run with the current learning
rates as inputs. The first step is compiled too: Adam's and AdamW's state is created as their first step
creates it, ahead of the update every step runs (`initial_state.py`); another optimizer's first step is a
graph of its own that also returns the state it creates, which goes into the optimizer's state. The
optimizer keeps its own state tensors, updated in place, so `state_dict()` and `load_state_dict()` work as
in eager. Each step re-checks the inputs gathered for the last update
(`prepared.py`) rather than rebuilding its structure key. What the compiled step does not cover runs the
optimizer's own `step`: a closure, step hooks, sparse or complex values, differentiable=True, other
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
from kiln.optim.initial_state import create_initial_state
from kiln.optim.prepared import PreparedStep, hashable, hyperparameters
from kiln.optim.trace import StepLayout, layout_of, trace_step

log = logging.getLogger("kiln.recompiles")
log_hints = logging.getLogger("kiln.perf_hints")

SUPPORTED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


class CompiledSteps:
    """The compiled updates of one optimizer, by structure; the one prepared for the last step; and the
    learning-rate inputs they read."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer_ref = weakref.ref(optimizer)
        self.entries: dict[tuple, tuple[StepLayout, Callable, tuple]] = {}
        self.last_key: tuple | None = None
        self.prepared: PreparedStep | None = None
        self.lrs: list[torch.Tensor] = []
        self.lr_values: list[Any] = []  # the value each of `lrs` holds, refilled only when it changes

    def run(self, optimizer: torch.optim.Optimizer, backend: Callable) -> str:
        """Run the compiled update; '' when it ran, else why this step cannot take it."""
        prepared = self.prepared
        inputs = prepared.inputs(optimizer) if prepared is not None and prepared.backend is backend else None
        if inputs is None:
            why = _unsupported_values(optimizer)
            if why:
                return why
            create_initial_state(optimizer)
            prepared = self.prepared = self.prepare(optimizer, backend)
            inputs = prepared.inputs(optimizer)
        prepared.run(optimizer, inputs + self._learning_rates(optimizer))
        return ""

    def prepare(self, optimizer: torch.optim.Optimizer, backend: Callable) -> PreparedStep:
        """The full path: the update for the optimizer's structure now, compiled if new."""
        layout = layout_of(optimizer)
        key = (id(backend), _structure_key(optimizer, layout))
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._compile(optimizer, layout, backend)
            if self.last_key is not None and not _first_step(self.last_key[1]):
                log.info("optimizer step of %s recompiles: %s changed", type(optimizer).__name__,
                         _what_changed(self.last_key[1], key[1]))
        self.last_key = key
        return PreparedStep(optimizer, backend, *entry)

    def _learning_rates(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """Per group, its lr as a 0-d tensor: the user's own when it is one, else kiln's, refilled when the
        value changed."""
        groups = optimizer.param_groups
        if len(self.lrs) != len(groups):  # on the group's device: the update graph reads no other device
            self.lrs = [torch.zeros((), dtype=torch.float64, device=g["params"][0].device) for g in groups]
            self.lr_values = [None] * len(groups)
        lrs = []
        for i, (group, held) in enumerate(zip(groups, self.lrs)):
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):
                lrs.append(lr)
                continue
            if lr != self.lr_values[i] or type(lr) is not type(self.lr_values[i]):
                held.fill_(lr)
                self.lr_values[i] = lr
            lrs.append(held)
        return lrs

    def _compile(self, optimizer: torch.optim.Optimizer, layout: StepLayout, backend: Callable):
        flat = layout.flat_inputs(optimizer, self._learning_rates(optimizer))
        gm, assigned = trace_step(optimizer, layout, flat)
        with torch.no_grad():
            return layout, backend(gm, flat), assigned


_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_step(optimizer: torch.optim.Optimizer, backend: Callable, *args, **kwargs) -> Any:
    """`optimizer.step(*args, **kwargs)`, through a compiled update where it applies (module docstring)."""
    why = _unsupported_call(optimizer, args, kwargs)
    if not why:
        steps = _steps.get(optimizer)
        if steps is None:
            steps = _steps[optimizer] = CompiledSteps(optimizer)
        why = steps.run(optimizer, backend)
    if why:
        log_hints.info("optimizer step of %s runs eagerly: %s", type(optimizer).__name__, why)
        return type(optimizer).step(optimizer, *args, **kwargs)
    optimizer._optimizer_step_code()
    return None


def _unsupported_call(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> str:
    """Why this call cannot take the compiled update, from what every step checks ('' when it can)."""
    if type(optimizer) not in SUPPORTED:
        return f"{type(optimizer).__name__} is not one of {', '.join(c.__name__ for c in SUPPORTED)}"
    if args or kwargs:
        return "step() was given a closure"
    if (optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
            or torch_optimizer._global_optimizer_pre_hooks or torch_optimizer._global_optimizer_post_hooks):
        return "step hooks are registered"
    return ""


def _unsupported_values(optimizer: torch.optim.Optimizer) -> str:
    """Why the optimizer's values keep it from the compiled update ('' when they do not); checked when the
    prepared update no longer applies (a prepared one was compiled for values that passed)."""
    if any(g.get("differentiable") for g in optimizer.param_groups):
        return "differentiable=True"
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None and (p.grad.is_sparse or p.is_complex()):
                return "a sparse grad or complex parameter"
    return ""


def _structure_key(optimizer: torch.optim.Optimizer, layout: StepLayout) -> tuple:
    """What a compiled update is specialized to: each parameter (identity, layout, its grad's and state's
    layouts) and each group's hyperparameters other than the learning rate."""
    tensors = tuple(
        (id(p), _meta(p), _meta(p.grad), tuple((k, _meta(optimizer.state[p][k])) for k in keys))
        for p, keys in zip(layout.params, layout.state_keys))
    groups = tuple(tuple(sorted((k, hashable(v)) for k, v in hyperparameters(g).items()))
                   for g in optimizer.param_groups)
    return (type(optimizer), layout.group_sizes, tensors, groups)


def _first_step(key: tuple) -> bool:
    """Whether the update of `key` was a first step (no parameter had state yet): the next one is compiled
    for the state it created, which is no recompile."""
    return all(not states for *_, states in key[2])


def _meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)


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

"""A compiled optimizer update with its inputs gathered once, and re-checked on each step.

Finding the update by its structure key reads every parameter's, grad's and state tensor's metadata in
Python, and gathering the inputs walks every group: on every step, for an optimizer that changes between
steps only in values. A prepared step keeps what the full path found and checks, each step, only what the
user can change:

- the objects `load_state_dict` and `add_param_group` replace or grow: `param_groups` and `state`;
- each group's dict, its parameter list (element by element) and its hyperparameters other than the
  learning rate (an input of the update, read each step);
- which parameters have a grad, and which state entries each parameter has;
- the metadata of every tensor the update reads (parameters, their current grads, state tensors; `p.data =`
  changes a parameter in place): one C++ call for all of them once kiln's tensor-check extension is loaded
  (kiln/capture/tensor_checks.py), the same comparisons in Python until then.

Any difference sends the step down the full path (`CompiledSteps.prepare`), which finds or compiles the
update for what it finds now.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.capture import tensor_checks
from kiln.optim.trace import StepLayout

IGNORED_HYPERPARAMETERS = frozenset({"params", "lr", "initial_lr"})  # lr is an input; initial_lr is the scheduler's


class PreparedStep:
    """One compiled update of one optimizer and backend, and the inputs it was prepared with."""

    def __init__(self, optimizer: torch.optim.Optimizer, backend: Callable, layout: StepLayout,
                 compiled: Callable, assigned: tuple[tuple[int, str], ...]) -> None:
        self.backend, self.layout, self.compiled, self.assigned = backend, layout, compiled, assigned
        self.param_groups, self.state = optimizer.param_groups, optimizer.state
        self.groups = [(g, list(g["params"]), len(g), {k: (v, hashable(v)) for k, v in hyperparameters(g).items()})
                       for g in optimizer.param_groups]
        self.params = list(layout.params)
        self.gradless = [p for g in optimizer.param_groups for p in g["params"] if p.grad is None]
        entries = [optimizer.state[p] for p in layout.params]
        # the state dict as it was, followed by identity: looking a tensor key up hashes it in Python
        self.state_params, self.state_dicts = list(optimizer.state), list(optimizer.state.values())
        self.param_entries = entries
        self.state_sizes = [len(e) for e in entries]
        self.state_entries = [(e, k) for e, keys in zip(entries, layout.state_keys) for k in keys]
        tensors = self.params + [p.grad for p in self.params] + self._states()
        self.specs = [tensor_spec(t) for t in tensors]
        self.native, self.native_pending = None, True
        self._use_native()

    def _use_native(self) -> None:
        """Check the tensors in C++ once the extension is loaded (it builds in the background), unless one is
        a subclass (whose properties Python code may define)."""
        module = tensor_checks.available()
        if module is None:
            return
        self.native_pending = False
        if all(spec[0] in tensor_checks.NATIVE_TYPES for spec in self.specs):
            self.native = (module.check, module.specs(self.specs))

    def inputs(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor] | None:
        """The update's tensor inputs now (params, grads, state), or None where anything it was prepared
        for changed."""
        if optimizer.param_groups is not self.param_groups or optimizer.state is not self.state:
            return None
        if len(self.param_groups) != len(self.groups) or not all(map(_same_group, self.param_groups, self.groups)):
            return None
        if any(p.grad is not None for p in self.gradless):
            return None
        state = self.state
        if (len(state) != len(self.state_params) or not all(map(_is, state, self.state_params))
                or not all(map(_is, state.values(), self.state_dicts))):
            return None
        if [len(e) for e in self.param_entries] != self.state_sizes:
            return None
        try:
            tensors = self.params + [p.grad for p in self.params] + self._states()
        except KeyError:  # an entry was replaced by another of the same count
            return None
        return tensors if self._check(tensors) else None

    def _states(self) -> list[torch.Tensor]:
        return [entries[k] for entries, k in self.state_entries]

    def _check(self, tensors: list) -> bool:
        if self.native_pending and tensor_checks._module is not None:
            self._use_native()
        if self.native is not None:
            check, specs = self.native
            return check(specs, *tensors)
        return all(_matches(t, spec) for t, spec in zip(tensors, self.specs))

    def run(self, optimizer: torch.optim.Optimizer, inputs: list[torch.Tensor]) -> None:
        """The compiled update over `inputs`; the state entries it creates go into the optimizer's state."""
        with torch.no_grad():
            outputs = self.compiled(*inputs)
        for (index, key), value in zip(self.assigned, outputs or ()):
            optimizer.state[self.params[index]][key] = value


def hyperparameters(group: dict) -> dict:
    return {k: v for k, v in group.items() if k not in IGNORED_HYPERPARAMETERS}


def hashable(value: Any) -> Any:
    """A hyperparameter as the structure key holds it: a tensor by identity (its value is the user's to
    change in place, as a scheduler's tensor learning rate is)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    return value


def _same_group(group: dict, prepared: tuple) -> bool:
    prepared_group, params, size, settings = prepared
    if group is not prepared_group or len(group) != size:
        return False
    current = group["params"]
    if len(current) != len(params) or not all(map(_is, current, params)):
        return False
    return all(_same_setting(group.get(k, _MISSING), *v) for k, v in settings.items())


def _same_setting(value: Any, prepared: Any, key: Any) -> bool:
    """Whether a hyperparameter is the one the update was compiled for: the same object, unless it is one the
    user can change in place (`group["betas"][0] = 0.8` on a list), else an equal key."""
    if value is prepared and not isinstance(value, (list, dict, set)):
        return True
    return hashable(value) == key


def _is(a: Any, b: Any) -> bool:
    return a is b


_MISSING = object()


def tensor_spec(t: torch.Tensor) -> tuple:
    """What the update was compiled for, in the tensor-check extension's spec format: (type, dtype, device,
    sizes, strides, requires_grad)."""
    return (type(t), t.dtype, t.device, tuple(t.shape), tuple(t.stride()), t.requires_grad)


def _matches(t: Any, spec: tuple) -> bool:
    """`tensor_spec(t) == spec`, false for anything that is not a strided tensor (a sparse grad)."""
    if type(t) is not spec[0] or not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
        return False
    return tensor_spec(t) == spec

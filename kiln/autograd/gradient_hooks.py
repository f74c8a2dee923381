"""Hooks that run only on a gradient, on the tensors a compiled graph's backward node may hand None.

Autograd runs a compiled graph's one backward node when any of its outputs gets a gradient. It then calls the
tensor hooks of every output, with None for those the loss does not reach (the node does not materialize
zeros), and of every input, with None for those only such outputs reach (runtime.py's `_drop_unreached`); the
None goes on through such an input's history (eager's nodes and other compiled graphs pass it on) to the leaves
behind it, whose tensor hooks, and post-accumulate-grad hooks, autograd calls too. Eager has a node per op and
never calls the hooks of a tensor its backward does not reach: a user's `lambda g: g.clamp(-1, 1)` never sees None.

The tensors concerned get hook dicts whose hooks skip an absent gradient: hooks registered later go through the
dict's `__setitem__` (`Tensor.register_hook`, `register_post_accumulate_grad_hook` insert into it), and hooks
registered before are wrapped in place, so that their handles still remove them. A leaf's post-accumulate-grad
hooks are called with the leaf, not the gradient: a first tensor hook notes whether the gradient was absent.
"""
from __future__ import annotations

import collections
import functools
from collections.abc import Callable

import torch

from kiln.autograd.history import reachable_nodes

_ABSENCE = "kiln: whether the gradient was absent"


class _AbsenceRecorder:
    """A leaf's tensor hook noting whether autograd's latest call for it brought a gradient: its
    post-accumulate-grad hooks, called next with the leaf, run only if it did."""

    __torch_unserializable__ = True  # nothing to warn about when the leaf is saved: it is kiln's, not the user's

    def __init__(self):
        self.absent = False

    def __call__(self, grad):
        self.absent = grad is None


class _GradientOnlyHooks(collections.OrderedDict):
    """A tensor-hook dict whose hooks run only on a gradient."""

    def __setitem__(self, key, hook):
        super().__setitem__(key, _on_gradient(hook))


class _AfterGradientHooks(collections.OrderedDict):
    """A leaf's post-accumulate-grad-hook dict whose hooks run only after a gradient was accumulated."""

    def __init__(self, recorder: _AbsenceRecorder):
        super().__init__()
        self.recorder = recorder

    def __setitem__(self, key, hook):
        super().__setitem__(key, _after_gradient(hook, self.recorder))


def _on_gradient(hook: Callable) -> Callable:
    if getattr(hook, "runs_on_gradients_only", False) or isinstance(hook, _AbsenceRecorder):
        return hook

    @functools.wraps(hook)  # keeps what torch reads off a hook (`__torch_unserializable__`)
    def run(grad):
        return None if grad is None else hook(grad)
    run.runs_on_gradients_only = True
    return run


def _after_gradient(hook: Callable, recorder: _AbsenceRecorder) -> Callable:
    if getattr(hook, "runs_on_gradients_only", False):
        return hook

    @functools.wraps(hook)
    def run(leaf):
        if not recorder.absent:
            hook(leaf)
    run.runs_on_gradients_only = True
    return run


def _adopt(new: collections.OrderedDict, old: dict | None) -> collections.OrderedDict:
    """`new` holding the hooks of `old`, the dict it replaces: each runs while `old` has it, since the handles
    that remove it (`RemovableHandle`) remove it from `old`; `new` keeps `old` alive for them."""
    if old:
        new.replaced = old
        for key, hook in old.items():
            new[key] = _while_in(old, key, hook)
    return new


def _while_in(hooks: dict, key, hook: Callable) -> Callable:
    @functools.wraps(hook)
    def run(value):
        return hook(value) if key in hooks else None
    return run


def hook_only_gradients(t: torch.Tensor) -> None:
    """Make the hooks of `t`, those it has and those registered later, skip absent gradients."""
    if not t.requires_grad or type(t._backward_hooks) is _GradientOnlyHooks:
        return
    if t.grad_fn is None:  # a leaf: autograd calls the dicts it has when the backward runs, which replace the old
        recorder = _AbsenceRecorder()
        hooks = _GradientOnlyHooks()
        collections.OrderedDict.__setitem__(hooks, _ABSENCE, recorder)
        t._backward_hooks = _adopt(hooks, t._backward_hooks)
        t._post_accumulate_grad_hooks = _adopt(_AfterGradientHooks(recorder), t._post_accumulate_grad_hooks)
    elif t._backward_hooks is None:
        t._backward_hooks = _GradientOnlyHooks()
        t.grad_fn._register_hook_dict(t)
    else:  # an intermediate's: its node keeps the dict it was given, whose hooks are wrapped where they are
        hooks = t._backward_hooks
        for key, hook in list(hooks.items()):
            hooks[key] = _on_gradient(hook)
def hook_only_gradients_upstream(t: torch.Tensor) -> None:
    """`hook_only_gradients` for `t` and every leaf its history reaches, which a None handed to `t` reaches."""
    hook_only_gradients(t)
    for node in reachable_nodes([t.grad_fn]):
        leaf = getattr(node, "variable", None)  # an AccumulateGrad node: the leaf it accumulates into
        if isinstance(leaf, torch.Tensor):
            hook_only_gradients(leaf)

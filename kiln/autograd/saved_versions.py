"""Eager's version check on the graph's inputs and outputs that eager's autograd saves.

Eager's `amin` saves its result; a later in-place write to it (or to a view of it, after a graph break)
bumps its version counter, and eager's backward raises when it unpacks the saved result. A compiled graph
saves what its partition chose (often not that tensor, or a copy of it), so nothing would check: the
backward would run on values the user has overwritten since. kiln finds, in the fake run of `analyze`,
which graph inputs and outputs eager's autograd saves, and through which differentiable outputs its backward
would reach them; the runtime keeps their version counters (through detached aliases, which share them)
and its backward raises eager's error where eager's would: a watched tensor written since the forward,
reached from an output that received a gradient.

An input the graph itself writes, and eager saves at its new value (`a.zero_()` then `a @ w`), is watched
from the version the call leaves it at: the runtime writes it after the forward graph ran (its version moves
then), so its watch is armed once those writes are done (`arm_pending`); a later write by the user then raises
at the backward, as eager's does.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.autograd.history import reachable_nodes
from kiln.autograd.storages import storage_of

OVERWRITTEN = ("one of the variables needed for gradient computation has been modified by an inplace operation: "
               "[{tensor}]{which} is at version {now}; expected version {then} instead. Hint: enable anomaly "
               "detection to find the operation that failed to compute its gradient, with "
               "torch.autograd.set_detect_anomaly(True).")
"""Eager's message (autograd's SavedVariable::unpack), with what kiln knows of the tensor."""


@dataclass(frozen=True)
class SavedByEager:
    """Flat input (`of_input`) or graph output `index` holds a value eager's backward saves; `reach`: the
    differentiable outputs (by tangent position) from which that backward would unpack it."""

    of_input: bool
    index: int
    reach: frozenset[int]
    which: str  # ", which is output 0 of AminBackward0,", as eager names the node that saved it
    written: bool = False  # an input the graph writes, saved by eager at the value the call leaves it with


class SavedTensorLog:
    """The tensors autograd saves while a fake run records it (`recording`), each behind a token."""

    def __init__(self):
        self.tensors: list[torch.Tensor] = []
        self.versions: list[int] = []  # each tensor's version when saved
        self.unpacked: set[int] = set()

    @contextmanager
    def recording(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def _pack(self, tensor: torch.Tensor) -> int:
        self.tensors.append(tensor)
        self.versions.append(tensor._version)
        return len(self.tensors) - 1

    def _unpack(self, token: int) -> torch.Tensor:
        self.unpacked.add(token)
        return self.tensors[token]

    def reached_from(self, root: torch.Tensor) -> set[int]:
        """The tokens of the saved tensors the backward from `root` unpacks: each node's saved values are
        read (`_saved_*`; a custom Function's, `ctx.save_for_backward`'s, as `saved_tensors`), which calls
        `_unpack`, over every node reachable from root's grad_fn."""
        self.unpacked = set()
        for node in reachable_nodes([root.grad_fn]):
            names = [name for name in dir(node) if name.startswith("_saved_")]
            if isinstance(node, torch.autograd.function.BackwardCFunction):
                names.append("saved_tensors")
            for name in names:
                try:
                    getattr(node, name)
                except RuntimeError:  # a value saved without a tensor behind it (an undefined one)
                    pass
        return self.unpacked


def saved_by_eager(log: SavedTensorLog, inputs: list[torch.Tensor], versions: list[int],
                   outputs: list[torch.Tensor], num_returned: int, differentiable: list[int]) -> list[SavedByEager]:
    """Which inputs and returned graph outputs (the first `num_returned`: the rest are new values of inputs,
    which the runtime copies into them) share storage, so a version counter, with a tensor eager's backward
    saves, and which differentiable outputs reach each. An input the run wrote (its version is no longer its
    entry in `versions`) is watched where eager saved its last value; one eager saved before a later write of
    the graph is not: eager's own backward trace raises there."""
    holders: dict[StorageWeakRef, tuple[bool, int]] = {}
    for j, t in enumerate(outputs[:num_returned]):
        holders.setdefault(storage_of(t), (False, j))
    for i, t in enumerate(inputs):
        holders.setdefault(storage_of(t), (True, i))
    written = {(True, i) for i, (t, v) in enumerate(zip(inputs, versions)) if t._version != v}
    reach: dict[tuple[bool, int], set[int]] = {}
    which: dict[tuple[bool, int], str] = {}
    for k, j in enumerate(differentiable):
        for token in log.reached_from(outputs[j]):
            saved = log.tensors[token]
            holder = holders.get(storage_of(saved))
            if holder is None or holder in written and log.versions[token] != inputs[holder[1]]._version:
                continue
            reach.setdefault(holder, set()).add(k)
            which.setdefault(holder, _which(saved))
    return [SavedByEager(of_input, index, frozenset(ks), which[(of_input, index)], (of_input, index) in written)
            for (of_input, index), ks in reach.items()]



def _which(saved: torch.Tensor) -> str:
    return f", which is output {saved.output_nr} of {saved.grad_fn.name()}," if saved.grad_fn is not None else ""


_PENDING = threading.local()  # the watch of the forward call running in this thread, armed after its writes


class VersionWatch:
    """The version counters of one forward call's watched tensors, checked when its backward runs."""

    def __init__(self, watched: list[SavedByEager], flat: tuple, outs: list):
        self.entries = []
        for w in watched:
            # An output is held through a detached alias, which shares its version counter without holding
            # its autograd node, the context itself (a cycle); an input holds no reference to the context.
            tensor = flat[w.index] if w.of_input else outs[w.index].detach()
            self.entries.append([w, tensor, None if w.written else tensor._version])
        _PENDING.watch = self if any(w.written for w in watched) else None

    def check(self, present: list[bool]) -> None:
        """Raise eager's error if a watched tensor was written since, and a present gradient reaches it."""
        for w, alias, version in self.entries:
            if version is not None and alias._version != version and any(present[k] for k in w.reach):
                raise RuntimeError(OVERWRITTEN.format(tensor=f"{alias.type()} {list(alias.shape)}", which=w.which,
                                                      now=alias._version, then=version))


def arm_pending() -> None:
    """Take the versions of the inputs the forward call just made wrote, now that the runtime wrote them."""
    watch = getattr(_PENDING, "watch", None)
    if watch is None:
        return
    _PENDING.watch = None
    for entry in watch.entries:
        if entry[0].written:
            entry[2] = entry[1]._version

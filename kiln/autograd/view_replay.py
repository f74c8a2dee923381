"""Outputs that view an input or another output, rebuilt as eager made them: their view ops replayed.

An output that aliases an input (`d.view(d.shape)[1:]`) or another output is rebuilt after the call as a view
of the real tensor (signature.py, `AliasOutput` / `OutputAlias`). Rebuilt with one `as_strided` at the traced
geometry, its values are right but its autograd history is not eager's: where the base's elements share memory
(an expanded input, stride 0), `as_strided`'s backward spreads the gradient of each memory location evenly over
the elements that share it, where eager's `slice` gives each element its own. AOTAutograd rebuilds such
outputs by replaying their views for the same reason.

So the analysis run records, for each tensor a view op makes, the tensor it views and the op with its other
arguments (`ViewRecorder`, a dispatch mode: the ATen view ops, under autograd, as eager ran them), and an
output's chain of `ViewStep`s from its base is replayed on the real base (`replay`): the same ops, the same
autograd nodes (`SliceBackward0`, `ExpandBackward0`, whose backward is also cheaper than `as_strided`'s),
`detach` and `view(dtype)` included. signature.py replays where the output has autograd history, where its base
shares memory between elements, and where a detached alias lies between it and its base (`y.detach()[1:]`, or a
returned `d = y.detach()` and `d.t()`: eager's `_base` is the alias); an output without history that plainly
views its base keeps the one `as_strided`, which costs less per call. A chain that does not reproduce
the output's geometry on the traced base (an in-place view op, `t_`, changed a tensor of it after the view was
taken) is not kept, and the output is rebuilt by `as_strided` as before.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class ViewStep:
    """ATen view op `op` (by name, `aten.slice.Tensor`) applied to the tensor viewed, with the other arguments
    `args` and keyword arguments `kwargs` ((name, value) pairs); `index` picks one result of an op with several
    (`unbind`, `split`). Plain data: the compile cache keeps it (aot_cache.py)."""

    op: str
    args: tuple
    kwargs: tuple = ()
    index: int | None = None


@dataclass(frozen=True)
class SizeSlot:
    """A symbolic size among a step's arguments: the `position`-th value the output's size function computes
    from each call's inputs."""

    position: int


_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.SymInt)


class ViewRecorder(TorchDispatchMode):
    """Each tensor a view op makes -> (that tensor, the tensor it views, the step; None where the op takes another
    tensor, which a step cannot name). The tensors are held so that their ids stay theirs while the recorder lives."""

    def __init__(self):
        super().__init__()
        self.parents: dict[int, tuple[torch.Tensor, torch.Tensor, ViewStep | None]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view and args and isinstance(args[0], torch.Tensor):
            many = isinstance(out, (list, tuple))
            for k, view in enumerate(out if many else (out,)):
                if view is not args[0]:  # `lift_fresh` returns its argument: no view of itself
                    self.parents[id(view)] = (view, args[0], _step(func, args[1:], kwargs, k if many else None))
        return out

    def parent(self, t: torch.Tensor) -> tuple[torch.Tensor, ViewStep | None] | None:
        """(the tensor `t` views, the step) where a view op recorded here made `t`, else None."""
        entry = self.parents.get(id(t))
        return (entry[1], entry[2]) if entry is not None and entry[0] is t else None

    def ancestors(self, t: torch.Tensor) -> list[torch.Tensor]:
        """The tensors `t` is a view of, nearest first, up to the one that owns its storage."""
        found = []
        while (entry := self.parent(t)) is not None:
            t = entry[0]
            found.append(t)
        return found

    def depth(self, t: torch.Tensor) -> int:
        """How many view ops lie between `t` and the tensor that owns its storage (0: `t` owns it)."""
        return len(self.ancestors(t))

    def chain(self, leaf: torch.Tensor, base: torch.Tensor) -> tuple[ViewStep, ...] | None:
        """The steps that make `leaf` from `base`, or None where `leaf` is no chain of recorded views of `base`."""
        steps = []
        while leaf is not base:
            entry = self.parent(leaf)
            if entry is None or entry[1] is None:
                return None
            leaf = entry[0]
            steps.append(entry[1])
        return tuple(reversed(steps))


def _step(func, args: tuple, kwargs: dict, index: int | None) -> ViewStep | None:
    """The step of one view op, its list arguments as tuples; None where an argument is not plain data."""
    values = pytree.tree_leaves((args, kwargs))
    if not all(isinstance(v, _PLAIN) for v in values):
        return None
    return ViewStep(str(func), _tuples(args), _tuples(sorted(kwargs.items())), index)


def _tuples(value):
    """`value` with every list in it a tuple (plain, hashable data)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def symbolic_sizes(steps: tuple[ViewStep, ...]) -> tuple[tuple[ViewStep, ...], list[torch.SymInt]]:
    """`steps` with each SymInt among their arguments replaced by a `SizeSlot`, and those SymInts in slot order
    (a dynamic graph computes them per call)."""
    sizes: list[torch.SymInt] = []

    def slot(v):
        sizes.append(v)
        return SizeSlot(len(sizes) - 1)

    return tuple(ViewStep(s.op, *pytree.tree_map_only(torch.SymInt, slot, (s.args, s.kwargs)), s.index)
                 for s in steps), sizes


def replay(base: torch.Tensor, steps: tuple[ViewStep, ...], sizes: tuple = ()) -> torch.Tensor:
    """The view `steps` make of `base`, each op run as eager ran it (under autograd where the caller's mode
    records); `sizes` fill the steps' `SizeSlot`s."""
    t = base
    for step in steps:
        args, kwargs = step.args, dict(step.kwargs)
        if sizes:
            args, kwargs = pytree.tree_map_only(SizeSlot, lambda s: sizes[s.position], (args, kwargs))
        out = _op(step.op)(t, *args, **kwargs)
        t = out if step.index is None else out[step.index]
    return t


@functools.cache
def _op(name: str) -> torch._ops.OpOverload:
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


__all__ = ["ViewStep", "SizeSlot", "ViewRecorder", "symbolic_sizes", "replay"]

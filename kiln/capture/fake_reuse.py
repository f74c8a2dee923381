"""Fake results reused within one capture: the same op on tensors of the same metadata gives the same metadata.

A model's repeated blocks (GPT-2's twelve layers) make the interpreter record the same calls again and again: the
same function, tensors of the same sizes, strides, dtypes and autograd flags, the same constants. Each call runs on
fake tensors to learn its result's metadata, and torch's fake dispatch of one call is costly: autocast's casts,
autograd's bookkeeping, and every part of a composite op (`scaled_dot_product_attention`'s math on the CPU is 88
dispatches). A warm process captures before it can look anything up in the compile cache, so this is most of what
its capture spends. Within one capture (one fake mode), a call whose description matches an earlier one gets a new
fake tensor of the earlier result's metadata instead of running again.

A call is described, and its result kept, only where the description fixes the result:
- the target is torch's own (a Tensor method, an `aten`/`prims` operator, a function of a `torch` module or of
  Python's `operator` or `math`), never a user's function or a custom op whose fake kernel is the user's code;
- every argument is a fake tensor of this capture's mode (described by its sizes, strides, storage offset, dtype,
  device, requires_grad, is_leaf, whether it is a view, whether it carries a constant's value) or a constant of a
  plain type (None, bool, int, float, str, dtype, device, layout, memory format, Ellipsis, slices and sequences of
  these), and no size is symbolic;
- torch's state that changes a result is the same: grad mode, inference mode, autocast, the default dtype, the
  attention backends, and no other torch function or dispatch mode, nor a functorch transform, is active.

And only a result that is new memory is kept: one fake tensor or a tuple of them, no view, sharing storage with no
argument nor with each other, at version 0, with no constant value, the call having written no argument (a batch
norm in training updates its running statistics in place: never reused). Views and in-place ops run every time:
their results alias their arguments, which a new tensor cannot. What the fake mode noted while the call ran (the
generators a random op draws from, ops that check values: `WatchingFakeMode`) is noted again at each reuse. A result
that required grad and was not a leaf is made with autograd history too (`_Computed`), so `is_leaf` and
`requires_grad` read as they would.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _len_torch_dispatch_stack

_CONSTANT_TYPES = frozenset((type(None), bool, int, float, str, torch.dtype, torch.device, torch.layout,
                             torch.memory_format, type(Ellipsis)))
_TORCH_OWN_MODULES = ("operator", "_operator", "math")
_OPERATOR_NAMESPACES = ("aten", "prims")
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")
# calls whose fake result was made from an earlier call's (`reused`), or run and kept for reuse (`kept`)
stats = {"reused": 0, "kept": 0}


class _NotDescribed(Exception):
    """A call whose description would not fix its result."""


class FakeResults:
    """The fake results of one capture's calls, by description (see the module docstring). `mode`: the capture's
    `WatchingFakeMode`."""

    def __init__(self, mode) -> None:
        self.mode = mode
        self._kept: dict[tuple, tuple] = {}  # description -> (the result's tensors' metadata, is_tuple, noted)
        self._not_kept: set[tuple] = set()  # descriptions of calls whose result aliases (views): run plainly
        self._anchor: FakeTensor | None = None  # a leaf that requires grad: the input of `_Computed`

    def describe(self, kind: str, target: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The description of `target(*args, **kwargs)` that fixes its result, or None."""
        if not _torch_own(kind, target) or _len_torch_dispatch_stack() or torch._C._len_torch_function_stack() \
                or torch._C._functorch.peek_interpreter_stack() is not None:  # modes and transforms: run them
            return None
        try:
            described = (kind, target, _state(), _describe(args, self.mode),
                         _describe(tuple(sorted(kwargs.items())), self.mode))
            hash(described)
        except (_NotDescribed, TypeError):  # TypeError: an unhashable target, or a symbolic size
            return None
        except RuntimeError:  # a view's history that autograd cannot rebuild on fake tensors (`_describe`)
            return None
        return described

    def reuse(self, described: tuple) -> Any:
        """A new result for a call described as an earlier one whose result was kept; None if none was."""
        kept = self._kept.get(described)
        if kept is None:
            return None
        tensors, is_tuple, (rng_devices, private_generator, checks_values) = kept
        self.mode.rng_devices |= rng_devices
        self.mode.uses_private_generator |= private_generator
        self.mode.checks_values |= checks_values
        made = tuple(self._make(*meta) for meta in tensors)
        stats["reused"] += 1
        return made if is_tuple else made[0]

    def run(self, described: tuple, call: Callable[[], Any], args: tuple, kwargs: dict) -> Any:
        """`call()` (the fake run of the call `described`), its result kept if it is new memory (see the module
        docstring). A call described as one whose result was not kept runs without the bookkeeping: its result
        is not kept again (a view stays a view)."""
        inputs = list(_tensors((args, kwargs)))
        versions = _versions(inputs)
        if described in self._not_kept or versions is None:
            return call()
        mode = self.mode
        before = mode.rng_devices, mode.uses_private_generator, mode.checks_values
        mode.rng_devices, mode.uses_private_generator, mode.checks_values = set(), False, False
        try:
            out = call()
        finally:
            noted = frozenset(mode.rng_devices), mode.uses_private_generator, mode.checks_values
            mode.rng_devices = before[0] | mode.rng_devices
            mode.uses_private_generator = before[1] or noted[1]
            mode.checks_values = before[2] or noted[2]
        tensors = _new_memory(out, inputs, mode)
        if tensors is not None and _versions(inputs) == versions:
            self._kept[described] = (tuple(map(_metadata, tensors)), type(out) is tuple, noted)
            stats["kept"] += 1
        else:
            self._not_kept.add(described)
        return out

    def _make(self, shape: tuple, stride: tuple, dtype: torch.dtype, device: torch.device, requires_grad: bool,
              is_leaf: bool) -> FakeTensor:
        def make() -> FakeTensor:
            return FakeTensor(self.mode, torch.empty_strided(shape, stride, dtype=dtype, device="meta"), device)

        if not requires_grad:
            return make()
        if is_leaf:
            return make().requires_grad_(True)
        if self._anchor is None:
            self._anchor = FakeTensor(self.mode, torch.empty((), device="meta"), torch.device("cpu"))
            self._anchor.requires_grad_(True)
        with torch.enable_grad():
            return _Computed.apply(self._anchor, make)


class _Computed(torch.autograd.Function):
    """Gives a made fake tensor the autograd history of an op's result (`is_leaf` False). Capture never runs a
    backward on fake tensors (`backward()` and `autograd.grad` end the graph), so its backward is never called."""

    @staticmethod
    def forward(ctx, anchor: FakeTensor, make: Callable[[], FakeTensor]) -> FakeTensor:
        return make()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("a fake result made by capture has no backward")


def _torch_own(kind: str, target: Any) -> bool:
    if kind == "call_method":
        return isinstance(target, str)
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace in _OPERATOR_NAMESPACES
    if isinstance(target, torch._ops.OpOverloadPacket):
        return False
    module = getattr(target, "__module__", None) or ""
    return module == "torch" or (module.startswith("torch.") and not module.startswith("torch._ops")) \
        or module in _TORCH_OWN_MODULES


def _state() -> tuple:
    """torch's settings that change an op's result metadata (dtype, layout, which kernel runs, autograd)."""
    autocast = ()
    if torch._C._is_any_autocast_enabled():
        autocast = (tuple((d, torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)),
                    torch.is_autocast_cache_enabled())
    backends = torch.backends.cuda
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast, torch.get_default_dtype(),
            backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(), backends.math_sdp_enabled(),
            backends.cudnn_sdp_enabled())


def _describe(value: Any, mode) -> Any:
    """`value` as a key. RuntimeError where reading a fake tensor's `is_leaf` raises: a view of a leaf that is
    itself a view of a tensor without grad, its base written in place since (`nn.init.zeros_(b[:1])`, then
    `b[1:]`), whose history autograd rebuilds by replaying the views on fake tensors and fails to (eager's real
    tensors rebuild it as an as_strided view). The call then runs on the fake tensors."""
    kind = type(value)
    if kind is FakeTensor:
        if value.fake_mode is not mode:
            raise _NotDescribed
        return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device,
                value.requires_grad, value.is_leaf, value._is_view(), value.constant is not None,
                isinstance(value, torch.nn.Parameter))
    if kind in _CONSTANT_TYPES:
        return kind, value
    if kind is tuple or kind is list or kind is torch.Size:
        return kind, tuple(_describe(v, mode) for v in value)
    if kind is slice:
        return slice, _describe(value.start, mode), _describe(value.stop, mode), _describe(value.step, mode)
    raise _NotDescribed


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _versions(tensors: list[torch.Tensor]) -> list[int] | None:
    """The tensors' version counters; None if one keeps none (an inference tensor: a write would not show)."""
    try:
        return [t._version for t in tensors]
    except RuntimeError:
        return None


def _new_memory(out: Any, inputs: list[torch.Tensor], mode) -> tuple[FakeTensor, ...] | None:
    """The tensors of `out` if it is new memory that a made tensor can stand for (see the module docstring)."""
    tensors = out if type(out) is tuple else (out,)
    storages = {t.untyped_storage()._cdata for t in inputs}
    for t in tensors:
        if type(t) is not FakeTensor or t.fake_mode is not mode or isinstance(t, torch.nn.Parameter):
            return None
        if t._is_view() or _versions([t]) != [0] or t.constant is not None or t.layout != torch.strided \
                or t.storage_offset() != 0 or t.is_conj() or t.is_neg():
            return None
        if not all(type(n) is int for n in (*t.shape, *t.stride())):
            return None
        storage = t.untyped_storage()._cdata
        if storage in storages:
            return None
        storages.add(storage)
    return tensors


def _metadata(t: FakeTensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad, t.is_leaf


__all__ = ["FakeResults", "stats"]

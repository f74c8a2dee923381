"""Calls that eager answers with their input tensor itself, where the capture's fake run may not show it.

`_returned_argument` (tensor.py) finds an op that returned its argument by the fake result's identity. That holds
where the fake run takes the C++ path eager takes; with symbolic sizes the fake run goes through the Python
dispatcher, where torch's Python decomposition of some ops returns a copy where ATen returns its input: dropout's
returns `input.clone()` when not training, while ATen's `_dropout_impl` returns `input` when `p == 0`, when not
training, or when the input has no elements. A returned dropout output is then eager's input object in eager and a
tensor of its own in kiln (`y = F.dropout(x, training=False); return y, x`: `y is x` in eager). The rules here tell
it from the call's constants instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.capture.values.base import Value

# function -> (the name of its training flag, that flag's default, the rank at which it returns its input: None for
# every rank; the others add a batch dim to an unbatched input and remove it from the result, a view of their own)
DROPOUTS = {
    F.dropout: ("training", True, None),
    F.alpha_dropout: ("training", False, None),
    F.feature_alpha_dropout: ("training", False, None),
    F.dropout1d: ("training", True, 3),
    F.dropout2d: ("training", True, None),
    F.dropout3d: ("training", True, 5),
    torch.dropout: ("train", None, None),
    torch.alpha_dropout: ("train", None, None),
    torch.feature_dropout: ("train", None, None),
    torch.feature_alpha_dropout: ("train", None, None),
}


def returned_input(target, args: list[Value], kwargs: dict[str, Value]) -> Value | None:
    """The input tracker where eager's `target(*args, **kwargs)` returns its input itself, else None. Called after
    the fake run succeeded, so the arguments passed the function's own checks (p within [0, 1])."""
    rule = DROPOUTS.get(target) if _hashable(target) else None
    if rule is None or not args:
        return None
    flag, default, rank = rule
    p = _constant(args[1] if len(args) > 1 else kwargs.get("p"), 0.5)
    training = _constant(args[2] if len(args) > 2 else kwargs.get(flag), default)
    tensor = args[0].realize()
    fake = getattr(tensor, "fake", None)
    if p is None or training is None or not isinstance(fake, torch.Tensor):
        return None
    if rank is not None and fake.dim() != rank:
        return None
    empty = any(isinstance(size, int) and size == 0 for size in fake.shape)  # a zero size is never a symbol
    return tensor if p == 0 or not training or empty else None


def _constant(value: Value | None, default):
    """The Python value of a constant argument (`default` where it is absent), None where it is not a constant."""
    if value is None:
        return default
    value = value.realize()
    return value.as_constant() if value.is_constant() else None


def _hashable(target) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True

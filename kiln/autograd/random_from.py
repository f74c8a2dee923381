"""`x.random_(low, high)` traced as an op whose name FX can print.

ATen names the overload `random_.from`, and functionalization makes it `random.from`: FX prints either as
`torch.ops.aten.random.from(...)`, which is no Python (`from` is a keyword), so a graph holding it failed to
compile its code (a SyntaxError from the backend) or to be stored. Tracing writes the draw as
`kiln.random_from`, a functional op running ATen's own `random_.from` into a fresh tensor of the input's
sizes and strides (passed as an argument, as in draws_in_place.py: a code generator passes the input in
a layout of its choosing): the same elements drawn in the same order from the same generator as eager's,
under a name FX prints. It carries ATen's `nondeterministic_seeded` tag, so no pass drops or repeats it.
"""
from __future__ import annotations

import torch

from kiln.autograd.draws_in_place import fresh_strided

aten = torch.ops.aten

_LIBRARY = torch.library.Library("kiln", "FRAGMENT")
_LIBRARY.define("random_from(Tensor self, SymInt[] stride, int low, int? high) -> Tensor",
                tags=(torch.Tag.nondeterministic_seeded,))


def _random_from(self: torch.Tensor, stride, low: int, high: int | None) -> torch.Tensor:
    return getattr(aten.random_, "from")(fresh_strided(self, stride), low, high)


_LIBRARY.impl("random_from", _random_from, "CompositeExplicitAutograd")
torch.library.register_fake("kiln::random_from", lambda self, stride, low, high: fresh_strided(self, stride),
                            lib=_LIBRARY)


def random_from_in_place(self: torch.Tensor, low: int, high: int | None = None, *, generator=None):
    """The tracing decomposition of `random_.from`: the draw as `kiln.random_from`, copied into `self` (a copy
    functionalization turns into the new value of `self`). A draw from a generator of the caller's stays as
    it is."""
    if generator is not None:
        return NotImplemented
    return self.copy_(torch.ops.kiln.random_from(self, self.stride(), low, high))

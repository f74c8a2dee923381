"""In-place random draws into a tensor laid out otherwise than row-major.

Functionalization turns `x.bernoulli_(p)` into `bernoulli.p(x, p)`, which allocates its result row-major
whatever x's strides are, and `x.normal_()` into `normal_functional(x)`, which draws into a dense clone of x
(on the CPU `normal_` takes a vectorized path on contiguous memory only). A code generator that runs a draw as
an extern passes it x in a layout of its own choosing. A kernel fills its elements in memory order, so where x
is laid out otherwise than row-major (dropout on a transposed activation: `empty_like` keeps its strides) the
numbers land at other positions than eager's: a wrong dropout mask.

Tracing therefore writes such a draw as a `kiln.<op>_drawn` op that runs ATen's own in-place op into a fresh
tensor of x's sizes and of strides passed to it as an argument (eager's kernel on eager's layout), copied
into x. A row-major x (the usual activation) keeps the op as it is, so a code generator still lowers it. A
draw from a generator of the caller's stays as it is.

`rand_like(x)` and its kin draw into `empty_like(x)` as eager does (`LIKE`): where x is not row-major (a
strided slice), written so, the draw is one of the above, and a code generator that runs `rand_like` as an
extern on x in a layout of its own no longer decides where the numbers land.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

_LIBRARY = torch.library.Library("kiln", "FRAGMENT")

DRAWS = (
    aten.bernoulli_.float, aten.bernoulli_.Tensor, aten.normal_.default, aten.uniform_.default,
    aten.exponential_.default, aten.geometric_.default, aten.cauchy_.default, aten.log_normal_.default,
    aten.random_.default, aten.random_.to,
)
"""ATen's in-place draws that write their first argument (`random_.from` has its own op: random_from.py)."""


def fresh_strided(self: torch.Tensor, stride) -> torch.Tensor:
    """An uninitialized tensor of `self`'s sizes and the written tensor's `stride`: drawn into, its elements take
    eager's order. The strides are an argument, not read from `self`: a code generator passes `self` in a layout
    of its choosing."""
    return torch.empty_strided(self.size(), stride, dtype=self.dtype, device=self.device)


def _arguments(op: torch._ops.OpOverload) -> list:
    """`op`'s arguments after `self`, less the generator: the drawn op takes them all positionally, so that
    FX prints its calls as Python (`uniform_` names one `from`)."""
    return [a for a in op._schema.arguments[1:] if a.name != "generator"]


def _schema(op: torch._ops.OpOverload, name: str) -> str:
    """`op`'s schema as a functional op `name`: `self` read, not written, then the strides to draw into, then
    `op`'s other arguments, all positional, no generator; a fresh tensor returned."""
    written = str(op._schema)
    arguments = written[written.index("(") + 1:written.rindex(") ->")].replace("(a!)", "").split(", ")
    kept = [a for a in arguments[1:] if a != "*" and not a.startswith("Generator?")]
    return f"{name}({', '.join(['Tensor self', 'SymInt[] stride', *kept])}) -> Tensor"


def _drawn_name(op: torch._ops.OpOverload) -> str:
    name, overload = op._schema.name.split("::")[-1], op._overloadname
    return f"{name}{'' if overload == 'default' else overload}_drawn"


def _define(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """`kiln.<op>_drawn`: ATen's `op` run on a fresh tensor of the given strides, tagged
    `nondeterministic_seeded` so that no pass drops or repeats it."""
    name = _drawn_name(op)
    _LIBRARY.define(_schema(op, name), tags=(torch.Tag.nondeterministic_seeded,))

    def drawn(self, stride, *args):
        return op(fresh_strided(self, stride), *args)

    _LIBRARY.impl(name, drawn, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kiln::{name}", lambda self, stride, *args: fresh_strided(self, stride), lib=_LIBRARY)
    return getattr(torch.ops.kiln, name).default


DRAWN = {op: _define(op) for op in DRAWS}


def _expr(size):
    """A size or stride, a symbolic one as its expression: comparing it adds no guard on the graph's sizes."""
    return size.node.expr if isinstance(size, torch.SymInt) else size


def _row_major(t: torch.Tensor) -> bool:
    """Is `t` laid out row-major (dims of size 1 aside)? Every functional variant then draws into a row-major
    tensor too, as a code generator passes `t`: the numbers land where eager's kernel puts them."""
    expected = 1
    for size, stride in reversed(list(zip(map(_expr, t.shape), map(_expr, t.stride())))):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected = expected * size
    return True


def draw_in_place(op: torch._ops.OpOverload):
    """The tracing decomposition of `op` (of `DRAWS`): where `self` is laid out otherwise than row-major, the
    draw as `kiln.<op>_drawn` copied into `self`; otherwise the op as it is. Row-major is the test, not the
    layout of the functional variant's fake result: `uniform`'s meta function keeps a gapped `self`'s strides
    where its kernel draws into a dense clone."""
    def decompose(self, *args, generator=None, **kwargs):
        if generator is not None or not isinstance(self, torch.Tensor) or _row_major(self):
            return NotImplemented
        positional = [*args, *(kwargs.get(a.name, a.default_value) for a in _arguments(op)[len(args):])]
        return self.copy_(DRAWN[op](self, self.stride(), *positional))
    return decompose


LIKE = {
    aten.rand_like.default: lambda t: t.uniform_(0, 1),
    aten.randn_like.default: lambda t: t.normal_(0, 1),
    aten.randint_like.default: lambda t, high: t.random_(0, high),
    aten.randint_like.low_dtype: lambda t, low, high: t.random_(low, high),
}
"""ATen's `*_like` draws, each as the in-place draw eager's kernel runs into `empty_like(self)`."""


def draw_like(op: torch._ops.OpOverload):
    """The tracing decomposition of `op` (of `LIKE`): where `self` is not row-major, `empty_like(self)` drawn
    into in place (see `draw_in_place`); otherwise the op as it is."""
    def decompose(self, *args, **options):
        if _row_major(self):
            return NotImplemented
        return LIKE[op](aten.empty_like(self, **options), *args)
    return decompose

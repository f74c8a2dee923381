"""The op templates a random program is built from: one row per statement shape, with its operand constraints.

A template is a format string. `{out}` names the new tensor variable, `{p}` a new Python value, `{a}`,
`{b}` the tensor operands (chosen among live tensors that satisfy `where`), `{x}` a live Python number,
and every other field is filled by the `fill` function of that name (a dim of `a`, a small constant...).
The constraints only need to be likely, not exact: the generator runs every candidate statement eagerly
on the inputs of every call and drops it when eager raises, so each program it emits is valid.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch


def is_float(t): return t.dtype.is_floating_point
def is_int(t): return t.dtype in (torch.int64, torch.int32)
def is_bool(t): return t.dtype == torch.bool
def is_num(t): return t.dtype != torch.bool
def is_any(t): return True
def has_dims(t): return t.dim() > 0
def is_2d_float(t): return t.dim() == 2 and is_float(t)


def broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(a.shape, b.shape)
        return True
    except RuntimeError:
        return False


def same_kind(a, b) -> bool:
    return broadcasts(a, b) and is_float(a) == is_float(b) and is_bool(a) == is_bool(b)


def dim_of(rng: random.Random, a) -> str:
    return str(rng.randrange(-a.dim(), a.dim())) if a.dim() else "0"


def step_slice(rng: random.Random, a) -> str:
    return rng.choice(["::2", "1:", ":-1", "1::2", "::3", ":2", "..., ::2", "..., 1:"])


def small(rng: random.Random, a=None) -> str:
    return rng.choice(["0", "1", "2", "-1", "3"])


def scalar(rng: random.Random, a=None) -> str:
    return rng.choice(["2", "-1", "0.5", "3", "1.5", "-2.25"])


def int_scalar(rng: random.Random, a=None) -> str:
    return rng.choice(["2", "3", "-1", "7", "-5"])


def perm_of(rng: random.Random, a) -> str:
    dims = list(range(a.dim()))
    rng.shuffle(dims)
    return ", ".join(map(str, dims)) or "()"


FILLS: dict[str, Callable] = {"dim": dim_of, "sl": step_slice, "k": small, "c": scalar, "ic": int_scalar,
                              "perm": perm_of}


@dataclass(frozen=True)
class Op:
    code: str
    where: Callable = is_any               # over the operands (a) or (a, b)
    operands: int = 1
    makes: str = "tensor"                  # "tensor": binds {out}; "python": binds {p}; "none": binds nothing;
                                           # "block": several lines that bind {out} themselves
    needs_python: bool = False             # uses a live Python number {x}


def ops(where, operands, *codes, **kw) -> list[Op]:
    return [Op(c, where, operands, **kw) for c in codes]


POINTWISE = (
    ops(is_float, 1, "torch.relu({a})", "torch.tanh({a})", "torch.sigmoid({a})", "{a}.sin()", "{a}.exp()",
        "torch.sqrt({a})", "torch.log({a}.abs() + 1)", "{a}.floor()", "torch.sign({a})", "{a}.reciprocal()",
        "{a} ** 2", "torch.clamp({a}, -0.5, 0.5)", "torch.nn.functional.gelu({a})", "{a}.round()",
        "torch.where({a} > 0, {a}, {a} * 0.1)", "torch.nan_to_num({a}).clamp(-1000, 1000).to(torch.int64)")
    + ops(is_num, 1, "{a}.abs()", "-{a}", "{a} * {c}", "{a} + {c}", "{a} - {ic}", "{a}.to(torch.float32)",
          "{a}.double()", "{a}.to(torch.bfloat16)", "{a} > 0", "{a} == {ic}", "torch.maximum({a}, {a} * 0)")
    + ops(is_int, 1, "{a} // {ic}", "{a} % {ic}", "{a} * {ic}", "{a} + {ic}", "{a} & 3", "{a} | 1", "{a} ^ {a}",
          "~{a}", "{a}.to(torch.int32)", "{a}.long()", "{a} >> 1", "{a} / {ic}", "torch.sign({a})", "{a}.abs()")
    + ops(is_bool, 1, "~{a}", "{a}.int()", "{a}.float()", "{a} & {a}.flip(0)" , "torch.logical_not({a})")
    + ops(is_any, 1, "{a}.clone()", "{a}.long()", "{a}.float()")
)

BINARY = (
    ops(broadcasts, 2, "{a} + {b}", "{a} * {b}", "{a} - {b}", "torch.maximum({a}, {b})", "{a} < {b}",
        "torch.where({a} > {b}, {a}, {b})", "{a} == {b}", "{a} / {b}")
    + ops(lambda a, b: broadcasts(a, b) and is_int(a) and is_int(b), 2,
          "{a} // {b}", "{a} % {b}", "{a} & {b}", "{a} ^ {b}", "{a} * {b}", "{a} - {b}")
    + ops(lambda a, b: broadcasts(a, b) and is_float(a), 2, "torch.atan2({a}, {b}.float())",
          "{a}.lerp({b}.to({a}.dtype), 0.3)", "torch.where({b} > 0, {a}, -{a})")
    + ops(lambda a, b: broadcasts(a, b) and is_bool(a) and is_bool(b), 2, "{a} | {b}", "{a} ^ {b}",
          "torch.logical_and({a}, {b})")
)

REDUCTIONS = (
    ops(lambda a: has_dims(a) and is_num(a), 1, "{a}.sum({dim})", "{a}.sum()", "{a}.amax({dim})",
        "{a}.amin({dim}, keepdim=True)", "{a}.argmax({dim})", "{a}.sum({dim}, keepdim=True)", "{a}.cumsum({dim})",
        "{a}.max()", "{a}.prod({dim})")
    + ops(lambda a: has_dims(a) and is_float(a), 1, "{a}.mean({dim})", "torch.softmax({a}, {dim})",
          "{a}.logsumexp({dim})", "{a}.var({dim})", "{a}.norm()", "torch.log_softmax({a}.float(), {dim})",
          "{a}.mean()", "{a}.std()")
    + ops(lambda a: has_dims(a) and is_bool(a), 1, "{a}.any({dim})", "{a}.all()", "{a}.sum()")
)

MATMUL = ops(lambda a, b: is_float(a) and a.dtype == b.dtype and a.dim() >= 1 and b.dim() >= 1
             and a.shape[-1] == b.shape[-2 if b.dim() > 1 else 0], 2,
             "{a} @ {b}", "torch.matmul({a}, {b})") + ops(is_2d_float, 1, "{a} @ {a}.t()", "{a}.t() @ {a}",
                                                          "torch.mm({a}, {a}.t()).relu()")

VIEWS = (
    ops(has_dims, 1, "{a}[{sl}]", "{a}.unsqueeze({dim})", "{a}.reshape(-1)", "{a}.view(-1)", "{a}.flatten()",
        "{a}.transpose(0, -1)", "{a}.permute({perm})", "{a}.unsqueeze(0).expand(2, *{a}.shape)", "{a}[0]",
        "{a}.narrow(0, 1, 1)", "{a}.flip(0)", "{a}.contiguous()", "{a}.reshape({a}.shape[0], -1)",
        "{a}.unsqueeze(-1).expand(*{a}.shape, 3)", "{a}[..., None]", "{a}.squeeze()", "{a}.T",
        "{a}.movedim(0, -1)", "{a}.view({a}.shape)", "{a}.select({dim}, 0)", "{a}.diagonal()",
        "{a}.unflatten(0, ({a}.shape[0], 1))")
    + ops(lambda a: a.dim() == 2, 1, "{a}.t()", "{a}[:, ::2]", "{a}[1:, 1:]", "{a}.t().reshape(-1)")
)

INPLACE = (
    ops(is_num, 1, "{a}.add_(1)", "{a}.mul_({ic})", "{a}.zero_()", "{a}.fill_(3)", "{a}.neg_()", makes="none")
    + ops(is_float, 1, "{a}.relu_()", "{a}.clamp_(-1, 1)", "{a}.sin_()", "{a}.div_(3)", makes="none")
    + ops(has_dims, 1, "{a}[{sl}] = 0", "{a}[0] = 1", "{a}.narrow(0, 0, 1).mul_(2)", makes="none")
    + ops(lambda a, b: broadcasts(a, b) and torch.broadcast_shapes(a.shape, b.shape) == a.shape, 2,
          "{a}.copy_({b})", "{a}.add_({b})", "{a}[...] = {b}", makes="none")
    + ops(is_num, 1, "{a}.add_(1)", "{a}.mul_(2)", "{a}.abs_()")  # binds {out}: `y = x.add_(1)` makes `y is x`
    + ops(has_dims, 1, "{a}[{sl}].mul_(2)", "{a}.t_() if {a}.dim() == 2 else {a}.unsqueeze_(0)")
)

CONTROL = [
    Op("{out} = {a}\nfor i in range({k} + 2):\n    {out} = {out} * 0.5 + i", is_num, makes="block"),
    Op("{out} = {a} * 0\nfor t in [{a}, {b}]:\n    {out} = {out} + t", broadcasts, 2, makes="block"),
    Op("{out} = {a}\nfor i, t in enumerate(({a}, {b})):\n    if i % 2 == 0:\n        {out} = {out} - t\n"
       "    else:\n        {out} = {out} * 2", broadcasts, 2, makes="block"),
    Op("if {a}.shape[0] > 3:\n    {out} = {a} + 1\nelse:\n    {out} = {a} - 1", has_dims, makes="block"),
    Op("if {a}.dim() == 2:\n    {out} = {a}.sum(1)\nelse:\n    {out} = {a}.reshape(-1)", has_dims, makes="block"),
    Op("if {a}.dtype == torch.float32:\n    {out} = {a} * 3\nelse:\n    {out} = {a}.clone()", makes="block"),
    Op("lst = [{a}, {b}]\nlst.append({a} * 2)\n{out} = lst[-1] + lst[0] + lst[1]", broadcasts, 2, makes="block"),
    Op("d = {{'x': {a}, 'y': {b}}}\nd['z'] = d['x'] * 2\n{out} = d['z'] + d.get('y') + len(d)", broadcasts, 2,
       makes="block"),
    Op("pair = ({a}, {a} * 2)\nfirst, second = pair\n{out} = second - first", makes="block"),
    Op("def helper(t, scale=2):\n    return t * scale + 1\n{out} = helper({a}) + helper({a}, scale=3)",
       is_num, makes="block"),
    Op("(lambda t: t.abs() + 1)({a})", is_num),
    Op("with torch.no_grad():\n    {out} = {a} * 2", makes="block"),
    Op("with torch.enable_grad():\n    {out} = {a} + 1", is_num, makes="block"),
    Op("parts = torch.split({a}, 1, dim={dim})\n{out} = sum(parts[1:], parts[0])", has_dims, makes="block"),
    Op("chunks = {a}.chunk(2, dim={dim})\n{out} = chunks[0] * 2", has_dims, makes="block"),
    Op("torch.cat([{a}, {b}], dim={dim})", lambda a, b: a.dim() == b.dim() and a.dim() > 0, 2),
    Op("torch.stack([{a}, {a} + 1])", is_num),
    Op("{a} * {x}", is_num, needs_python=True),
    Op("{a}.reshape(-1)[:max(int({x}) % 5, 1)] if {a}.numel() else {a}", has_dims, needs_python=True),
]

GRAPH_BREAKS = [
    Op("print(tuple({a}.shape), {a}.dtype, file=BUF)", makes="none"),
    Op("{p} = {a}.sum().item()", is_num, makes="python"),
    Op("{p} = {a}.flatten()[:3].tolist()", makes="python"),
    Op("{p} = int({a}.numel())", makes="python"),
    Op("{p} = {a}.shape[0]", has_dims, makes="python"),
    Op("{p} = len({a})", has_dims, makes="python"),
    Op("if {a}.sum() > 0:\n    {out} = {a} + 1\nelse:\n    {out} = {a} - 1", is_num, makes="block"),
    Op("if {a}.any():\n    {out} = {a}.float() * 2\nelse:\n    {out} = {a}.float()", makes="block"),
    Op("kiln.graph_break()\n{out} = {a} * 2", is_num, makes="block"),
    Op("{a}.nonzero()", has_dims),
    Op("{a}[{a} > 0]", is_num),
    Op("{p} = len({a}[{a} > 0])", is_num, makes="python"),
    Op("{a}.float() * float({a}.float().mean())", has_dims),
]

STATE = [
    Op("STATE['n'] = STATE.get('n', 0) + 1", makes="none"),
    Op("STATE['shape'] = tuple({a}.shape)", makes="none"),
    Op("STATE['last'] = {a}.detach()", makes="none"),
    Op("LOG.append({a}.dim())", makes="none"),
    Op("OBJ.total = getattr(OBJ, 'total', 0) + {a}.shape[0]", has_dims, makes="none"),
    Op("OBJ.last = {a}", makes="none"),
    Op("Obj.count += 1", makes="none"),
    Op("{a} * Obj.scale", is_num),
    Op("{a} + SCALE", is_num),
    Op("STATE.setdefault('seen', []).append({a}.shape[-1] if {a}.dim() else 0)", makes="none"),
]

# how often each family is drawn; `make_body` in programs.py picks a family, then an op of it
FAMILIES: list[tuple[str, list[Op], float]] = [
    ("pointwise", POINTWISE, 5), ("binary", BINARY, 4), ("reduction", REDUCTIONS, 2), ("matmul", MATMUL, 1),
    ("view", VIEWS, 3), ("inplace", INPLACE, 2), ("control", CONTROL, 2), ("graph_break", GRAPH_BREAKS, 1.2),
    ("state", STATE, 1),
]

__all__ = ["Op", "FAMILIES", "FILLS"]

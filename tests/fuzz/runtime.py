"""What a generated program sees besides torch: input makers and the Python state it may read and write.

A program's `inputs(call)` builds its arguments with the makers below from a seeded generator, so the
eager run and the compiled run get equal (and equally aliased) arguments, and a pasted program replays
exactly. Values are made on the CPU and moved to `DEVICE` (set by the harness) before any view is taken.
"""
from __future__ import annotations

import io
import math

import torch

import kiln

DEVICE = "cpu"

INT_EDGES = {
    torch.int64: (0, -1, 1, -(2 ** 63), 2 ** 63 - 1, 7),
    torch.int32: (0, -1, 1, -(2 ** 31), 2 ** 31 - 1, 7),
}


FLOAT_EDGES = (float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 1e30, -1e-30)


def randn(g: torch.Generator, shape, dtype=torch.float32, grad: bool = False, edges: bool = False,
          layout: str = "") -> torch.Tensor:
    """Normal floats of `dtype`; with `edges`, about a third are inf, -inf, nan, -0.0, 0.0 or huge or tiny
    values; laid out as `layout` says (see `laid_out`); a leaf that requires grad when `grad`."""
    t = torch.randn(tuple(shape), generator=g)
    if edges and t.numel():
        table = torch.tensor(FLOAT_EDGES)
        pick = torch.randint(0, len(table), tuple(shape), generator=g)
        t = torch.where(torch.rand(tuple(shape), generator=g) < 0.35, table[pick], t)
    t = laid_out(t.to(dtype).to(DEVICE), layout)
    return t.requires_grad_(grad)


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """`t`'s values in another memory layout, so compiled code meets the strides users' tensors have:
    "t" column-major (a transposed copy, transposed back), "channels_last" (4-d), "expand" (the first row
    broadcast along dim 0: stride 0, values change), "expand_last" (the first column broadcast along the last
    dim), "windows" (rows that are overlapping windows of one vector: row i starts at element i, strides ATen
    does not check for overlap), "offset" (a view at a storage offset), "negated" (a float tensor lazily negated:
    its memory holds the negated values, as `z.conj().imag`'s does), "" as made."""
    if layout == "t" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "channels_last" and t.dim() == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "expand" and t.dim() >= 1 and t.shape[0]:
        return t[:1].expand(t.shape)
    if layout == "expand_last" and t.dim() >= 1 and t.shape[-1]:
        return t[..., :1].expand(t.shape)
    if layout == "windows" and t.dim() >= 2 and t.shape[0] > 1 and t.numel():
        row = t[0].numel()
        rest = torch.empty(t.shape[1:]).stride()
        return t.reshape(-1)[:t.shape[0] - 1 + row].clone().as_strided(t.shape, (1, *rest))
    if layout == "negated" and t.is_floating_point():
        return (-t)._neg_view()
    if layout == "offset":
        return torch.cat([t.reshape(-1)[:1], t.reshape(-1)]).detach()[1:].view(t.shape) if t.numel() else t
    return t


def ints(g: torch.Generator, shape, dtype=torch.int64, edges: bool = False, layout: str = "") -> torch.Tensor:
    """Small integers in [-4, 4]; with `edges`, about a third are 0, -1, 1, the dtype's min and max."""
    t = torch.randint(-4, 5, tuple(shape), generator=g, dtype=dtype)
    if edges and t.numel():
        table = torch.tensor(INT_EDGES[dtype], dtype=dtype)
        pick = torch.randint(0, len(table), tuple(shape), generator=g)
        use = torch.rand(tuple(shape), generator=g) < 0.35
        t = torch.where(use, table[pick], t)
    return laid_out(t.to(DEVICE), layout)


def bools(g: torch.Generator, shape, layout: str = "") -> torch.Tensor:
    return laid_out((torch.rand(tuple(shape), generator=g) > 0.5).to(DEVICE), layout)


class Obj:
    """A user class whose class and instance attributes compiled code reads and writes."""
    scale = 2.0
    count = 0


class ScaledGrad(torch.autograd.Function):
    """`x * 2` forward, a backward that is not its derivative (scales by `k`): compiled code must run the
    user's backward, not derive one from the forward."""
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.k, None


class SavedSquare(torch.autograd.Function):
    """`x * x`, saving its input for the backward with save_for_backward."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return 2 * x * grad


class SinCos(torch.autograd.Function):
    """Two outputs, the second marked non-differentiable, in the setup_context style."""
    @staticmethod
    def forward(x):
        return x.sin(), (x > 0).to(x.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, = inputs
        ctx.save_for_backward(x)
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad_sin, grad_sign):
        x, = ctx.saved_tensors
        return grad_sin * x.cos()


def make_scaler():
    """A closure whose cell compiled code rebinds (`nonlocal`): the cell's value is Python state."""
    factor = 1.0

    def scale(t):
        nonlocal factor
        factor = factor * 2 - 0.5
        return t * factor
    return scale


def fresh_namespace() -> dict:
    """The globals a program's source is executed in: one per run, so the eager and compiled runs don't share state."""
    obj_cls = type("Obj", (), {"scale": Obj.scale, "count": Obj.count})
    return {"torch": torch, "kiln": kiln, "io": io, "math": math, "randn": randn, "ints": ints, "bools": bools,
            "Obj": obj_cls, "OBJ": obj_cls(), "STATE": {}, "LOG": [], "BUF": io.StringIO(), "SCALE": 1.5,
            "ScaledGrad": ScaledGrad, "SavedSquare": SavedSquare, "SinCos": SinCos, "SCALER": make_scaler(),
            "__name__": "fuzz_program"}


def python_state(ns: dict) -> dict:
    """The Python state a program may have changed: compared between the eager and compiled runs."""
    cls = ns["Obj"]
    state = {"STATE": ns["STATE"], "LOG": ns["LOG"], "BUF": ns["BUF"].getvalue(), "SCALE": ns["SCALE"],
             "Obj": {k: v for k, v in vars(cls).items() if not k.startswith("__")}, "OBJ": dict(vars(ns["OBJ"])),
             "SCALER": ns["SCALER"].__closure__[0].cell_contents, "grad_enabled": torch.is_grad_enabled()}
    if "MODEL" in ns:
        state["MODEL"] = module_state(ns["MODEL"])
    return state


def module_state(model: torch.nn.Module) -> dict:
    """A module's parameters and buffers (values) and its parameters' `.grad`, by name."""
    state = {name: value.detach().clone() for name, value in model.state_dict(keep_vars=True).items()}
    state.update({f"{name}.grad": p.grad.detach().clone() if p.grad is not None else None
                  for name, p in model.named_parameters()})
    return state

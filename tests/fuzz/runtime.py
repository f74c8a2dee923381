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


def randn(g: torch.Generator, shape, dtype=torch.float32, grad: bool = False) -> torch.Tensor:
    """Normal floats of `dtype`; a leaf that requires grad when `grad`."""
    t = torch.randn(tuple(shape), generator=g).to(dtype).to(DEVICE)
    return t.requires_grad_(grad)


def ints(g: torch.Generator, shape, dtype=torch.int64, edges: bool = False) -> torch.Tensor:
    """Small integers in [-4, 4]; with `edges`, about a third are 0, -1, 1, the dtype's min and max."""
    t = torch.randint(-4, 5, tuple(shape), generator=g, dtype=dtype)
    if edges and t.numel():
        table = torch.tensor(INT_EDGES[dtype], dtype=dtype)
        pick = torch.randint(0, len(table), tuple(shape), generator=g)
        use = torch.rand(tuple(shape), generator=g) < 0.35
        t = torch.where(use, table[pick], t)
    return t.to(DEVICE)


def bools(g: torch.Generator, shape) -> torch.Tensor:
    return (torch.rand(tuple(shape), generator=g) > 0.5).to(DEVICE)


class Obj:
    """A user class whose class and instance attributes compiled code reads and writes."""
    scale = 2.0
    count = 0


def fresh_namespace() -> dict:
    """The globals a program's source is executed in: one per run, so the eager and compiled runs don't share state."""
    obj_cls = type("Obj", (), {"scale": Obj.scale, "count": Obj.count})
    return {"torch": torch, "kiln": kiln, "io": io, "math": math, "randn": randn, "ints": ints, "bools": bools,
            "Obj": obj_cls, "OBJ": obj_cls(), "STATE": {}, "LOG": [], "BUF": io.StringIO(), "SCALE": 1.5,
            "__name__": "fuzz_program"}


def python_state(ns: dict) -> dict:
    """The Python state a program may have changed: compared between the eager and compiled runs."""
    cls = ns["Obj"]
    return {"STATE": ns["STATE"], "LOG": ns["LOG"], "BUF": ns["BUF"].getvalue(), "SCALE": ns["SCALE"],
            "Obj": {k: v for k, v in vars(cls).items() if not k.startswith("__")}, "OBJ": dict(vars(ns["OBJ"]))}

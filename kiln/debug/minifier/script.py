"""The repro script: a failing graph as a standalone program that shows the failure, and reading one back.

The script holds the graph as a module (`Repro`), its inputs' metadata (shape, stride, dtype, device,
requires_grad, and for integer tensors the range of the values seen), the path the graph took through kiln
(`AFTER`: "capture" runs it through `kiln.compile` with the backend it failed in; "aot" hands it, as the ATen
graph it is, to kiln's code generator) and what failed (`FAILURE`). Run, it builds random inputs of that
metadata, runs the graph eagerly and through kiln, and prints the failure; `python -m kiln minify` reads the
same names back (`load`). Where random inputs do not show the failure, the failing values are saved next to
the script (`<name>.pt`) and used instead.
"""
from __future__ import annotations

import importlib
import inspect
import re
import runpy
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.debug.accuracy import _import_line
from kiln.debug.minifier.graphs import Case


@dataclass
class Repro:
    """What a repro script defines."""

    case: Case
    after: str  # "capture" | "aot"
    failure: str  # "crash" | "accuracy" (what was seen when it was written)
    backend: Any  # after capture: a backend name or callable; after aot: kiln's inductor
    options: dict
    kind: str  # after aot: the ATen graph's kind (inference, forward, backward), which some stages read


def input_spec(t: Any) -> str:
    """One input of the script: a tensor as `make_tensor(shape, stride, dtype, device[, requires_grad, low, high])`."""
    if not isinstance(t, torch.Tensor):
        return repr(t)
    extra = ""
    if t.requires_grad:
        extra += ", requires_grad=True"
    if not (t.is_floating_point() or t.is_complex()) and t.numel():
        extra += f", low={int(t.min())}, high={int(t.max())}"
    return f"make_tensor({tuple(t.shape)}, {tuple(t.stride())}, {t.dtype}, {str(t.device)!r}{extra})"


def make_tensor(shape, stride, dtype, device, requires_grad=False, low=0, high=1) -> torch.Tensor:
    """A tensor of this metadata with random values: normal floats, integers drawn from [low, high]."""
    out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        out.copy_(torch.randn(shape, dtype=dtype, device=device))
    else:
        out.copy_(torch.randint(low, high + 1, shape, device=device).to(dtype))
    return out.requires_grad_(requires_grad)


def write(repro: Repro, path: Path, note: str, backend_import: str, backend_expr: str) -> Path:
    """Write the script; `backend_import`/`backend_expr` say how it reaches the backend (capture only)."""
    gm = repro.case.gm
    code = gm.graph.python_code(root_module="self")
    used = set(re.findall(r"[A-Za-z_]\w*", code.src))  # FX lists helpers (pytree, NoneType) the code may not use
    imports = sorted({line for name, value in code.globals.items() if name in used
                      and (line := _import_line(name, value))})
    body = ["    " + line for line in code.src.strip().splitlines()]
    inputs = "".join(f"\n        {input_spec(t)}," for t in repro.case.inputs)
    text = TEMPLATE.format(
        note=note, name=path.name, imports="\n".join(imports + ([backend_import] if backend_import else [])),
        after=repro.after, failure=repro.failure, backend=backend_expr, options=repr(repro.options),
        kind=repro.kind, body="\n".join(body), inputs=inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def save_inputs(repro: Repro, path: Path) -> Path:
    """The failing values themselves, where random ones do not show the failure; the script loads them."""
    saved = path.with_suffix(".pt")
    torch.save([t.detach() if isinstance(t, torch.Tensor) else t for t in repro.case.inputs], saved)
    return saved


def load(path: str | Path) -> tuple[Repro, dict]:
    """Read a repro script back: the graph (traced from `Repro`), its inputs, and where it failed."""
    namespace = runpy.run_path(str(path), run_name="kiln_repro")
    module = namespace["Repro"]()
    # builtins the graph's code calls on symbolic sizes (`round(s0 / 2)`) stay calls: a proxy has no __round__
    builtins = tuple(v for v in namespace.values() if isinstance(v, types.BuiltinFunctionType)
                     and getattr(v, "__module__", None) == "builtins")
    gm = torch.fx.GraphModule(module, torch.fx.Tracer(autowrap_functions=builtins).trace(module))
    gm.meta["kiln.aot"] = {"kind": namespace["KIND"], "name": "repro"}
    torch.manual_seed(0)
    inputs = namespace["make_inputs"]()
    repro = Repro(Case(gm, inputs), namespace["AFTER"], namespace["FAILURE"], namespace["BACKEND"],
                  namespace["OPTIONS"], namespace["KIND"])
    return repro, namespace


def backend_reference(backend: Any, registered: dict) -> tuple[str, str]:
    """(import line, expression) by which the script names `backend`: its registered name, else its module and
    name; a backend no script can import (a lambda, a function of `__main__`) is left for the reader to fill in."""
    if isinstance(backend, str):
        return "", repr(backend)
    backend = inspect.unwrap(backend)  # the user's backend inside kiln's wrappers (DDP's bucketing)
    name = next((key for key, fn in registered.items() if fn is backend), None)
    if name is not None and getattr(backend, "__module__", "").startswith("kiln."):  # kiln's own: known by name
        return "", repr(name)
    module, qualname = getattr(backend, "__module__", None), getattr(backend, "__qualname__", "")
    root, _, rest = qualname.partition(".")
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, TypeError, ValueError):
        found = None
    if found is not backend or module == "__main__":
        return "", f"'eager'  # FILL IN: the backend was {backend!r}, which this script cannot import"
    return f"from {module} import {root} as _backend", "_backend" + (f".{rest}" if rest else "")


TEMPLATE = '''"""kiln repro: {note}

Run it to see the failure (the graph eagerly and through kiln): python {name}
Shrink it to the fewest nodes that still fail: python -m kiln minify {name}
"""
import importlib  # noqa: F401  (the imports below may name a function by its module)
import os
import sys
from pathlib import Path

import torch
from torch import device, inf, nan  # noqa: F401  (names the graph's code may use)

import kiln
from kiln.debug.minifier.script import make_tensor
{imports}

AFTER = {after!r}  # "capture": the FX graph given to the backend; "aot": an ATen graph given to kiln's codegen
FAILURE = {failure!r}  # what failed when this was written: "crash" or "accuracy" (differs from eager)
BACKEND = {backend}
OPTIONS = {options}
KIND = {kind!r}  # the ATen graph's kind (after aot)


class Repro(torch.nn.Module):
{body}


def make_inputs():
    saved = Path(__file__).with_suffix(".pt")
    if saved.exists():  # the failing values (random ones did not show the failure)
        return torch.load(saved)
    return [{inputs}
    ]


def compile_graph(model, args):
    """The path the failing graph took through kiln."""
    if AFTER == "capture":
        return kiln.compile(model, backend=BACKEND, options=OPTIONS or None)
    gm = torch.fx.symbolic_trace(model)
    gm.meta["kiln.aot"] = {{"kind": KIND, "name": "repro"}}
    return kiln.pipeline.compile_aten_graph(gm, args, OPTIONS)


def main():
    os.environ["KILN_STRICT"] = "1"  # a kernel kiln cannot build raises, instead of running through ATen
    os.environ["KILN_REPRO_LEVEL"] = "0"  # this run shows the failure; it writes no repro of its own
    torch.manual_seed(0)
    args = make_inputs()
    model = Repro()
    expected = model(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    try:
        actual = compile_graph(model, args)(*args)
    except Exception as e:
        print(f"kiln raised {{type(e).__name__}}: {{e}}")
        return 1
    failed = False
    leaves = torch.utils._pytree.tree_leaves
    for i, (a, e) in enumerate(zip(leaves(actual), leaves(expected))):
        if isinstance(a, torch.Tensor):
            a, e = a.detach().double(), e.detach().double()
            err = (a - e).abs().nan_to_num(0.0).max().item() if a.numel() else 0.0
            ok = torch.allclose(a, e, rtol=1e-3, atol=1e-3, equal_nan=True)
            failed |= not ok
            print(f"output {{i}}: max abs error {{err:.3g}}", "OK" if ok else "MISMATCH: kiln differs from eager")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''

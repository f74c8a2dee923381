"""Accuracy debugging: compiled graphs checked against eager, the first diverging node found, a repro saved.

    kiln.compile(model, options={"check_accuracy": True})              # kiln's inductor
    kiln.compile(model, backend=kiln.debug.check_accuracy(my_backend))  # any backend

Each call of a checked graph also runs the captured graph eagerly on copies of
the same inputs and compares every output (`torch.allclose` with rtol/atol,
NaNs equal). On the first mismatch of a graph, kiln looks for the first node
that diverges: it compiles prefixes of the graph whose outputs are every
intermediate tensor, with the same backend, and bisects for the shortest
prefix that mismatches eager. It then writes a standalone repro script (the
graph as a module, its inputs' shapes and dtypes, eager vs compiled) to
`<debug dir>/repro/graph<N>.py`, warns with the graph, the node and the
script's path, and keeps an `AccuracyFailure` in `failures`.
"""
from __future__ import annotations

import copy
import importlib
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from kiln.config import debug_dir
from kiln.runtime.private_files import PrivateTree, write_atomic

log = logging.getLogger("kiln.accuracy")
_tree = PrivateTree("debug directory")


@dataclass
class AccuracyFailure:
    graph: str  # "graph 3 (forward)", or the graph module's frame
    node: str | None  # the first diverging node: its name and code, or None if no prefix diverged
    max_abs_error: float
    repro: Path | None

    def __str__(self) -> str:
        where = f"first diverging node: {self.node}" if self.node else "no single node diverged on its own"
        repro = f"; repro: {self.repro}" if self.repro else ""
        return (f"kiln accuracy: {self.graph} differs from eager (max abs error {self.max_abs_error:.3g}); "
                f"{where}{repro}")


failures: list[AccuracyFailure] = []


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        return c.requires_grad_(x.requires_grad) if c.is_floating_point() or c.is_complex() else c
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    return x


def compare(actual: Any, expected: Any, rtol: float, atol: float) -> float | None:
    """None when every tensor of `actual` matches `expected`, else the largest absolute error."""
    a_flat, _ = tree_flatten(actual)
    e_flat, _ = tree_flatten(expected)
    worst = None
    for a, e in zip(a_flat, e_flat):
        if not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
            continue
        a, e = a.detach(), e.detach()
        if a.shape != e.shape:
            return float("inf")
        if a.is_floating_point() or a.is_complex():
            ok = torch.allclose(a.to(e.dtype), e, rtol=rtol, atol=atol, equal_nan=True)
            err = (a.to(e.dtype) - e).abs().nan_to_num(0.0).max().item() if a.numel() else 0.0
        else:
            ok, err = torch.equal(a, e), float((a != e).sum().item())
        if not ok:
            worst = max(worst or 0.0, err)
    return worst


def check_accuracy(backend: Callable, rtol: float = 1e-3, atol: float = 1e-3) -> Callable:
    """`backend` with every compiled graph checked against eager on each call (see the module doc)."""

    def checked(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        # eager runs an untouched copy of the graph (a backend may rewrite gm), sharing gm's parameters
        reference = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
        reference.meta = dict(getattr(gm, "meta", {}))
        compiled = backend(gm, example_inputs)
        label = _label(gm)
        state = {"reported": False}

        def run(*args):
            with torch.no_grad():
                expected = reference(*_clone(list(args)))
            out = compiled(*args)
            err = compare(out, expected, rtol, atol)
            if err is not None and not state["reported"]:
                state["reported"] = True
                report(reference, [_clone(a) for a in args], backend, label, err, rtol, atol)
            return out

        run._kiln_checked = compiled
        for attr in ("compiled_graphs", "traces"):  # what reports read from kiln's backend
            if hasattr(compiled, attr):
                setattr(run, attr, getattr(compiled, attr))
        return run

    checked.__name__ = f"check_accuracy({getattr(backend, '__name__', backend)})"
    return checked


def _label(gm: torch.fx.GraphModule) -> str:
    gid = gm.meta.get("kiln.graph_id") if isinstance(getattr(gm, "meta", None), dict) else None
    frame = gm.meta.get("frame", "") if isinstance(getattr(gm, "meta", None), dict) else ""
    return f"graph {gid} of {frame}" if gid is not None else (frame or "graph")


def report(gm: torch.fx.GraphModule, args: list, backend: Callable, label: str, err: float,
           rtol: float, atol: float) -> AccuracyFailure:
    try:
        node = first_divergent_node(gm, args, backend, rtol, atol)
    except Exception as e:  # the search is best effort; the mismatch itself is still reported
        log.debug("divergence search failed", exc_info=True)
        node = None
        label += f" (node search failed: {type(e).__name__}: {e})"
    where = None
    try:
        gid = gm.meta.get("kiln.graph_id", len(failures))
        where = write_repro(gm, args, debug_dir() / "repro" / f"graph{gid}.py",
                            note=f"{label}: differs from eager; first diverging node: {node}")
    except Exception:
        log.debug("repro writer failed", exc_info=True)
    failure = AccuracyFailure(label, node, err, where)
    failures.append(failure)
    warnings.warn(str(failure), stacklevel=2)
    return failure


# ------------------------------------------------------------------------------------------
# The first diverging node: bisect over prefixes of the graph
# ------------------------------------------------------------------------------------------

def _tensor_nodes(gm: torch.fx.GraphModule, env: dict) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
            and isinstance(env.get(n), torch.Tensor)]


def prefix_graph(gm: torch.fx.GraphModule, upto: list[torch.fx.Node]) -> torch.fx.GraphModule:
    """`gm` cut after upto[-1], returning every node of `upto` (a tuple of tensors)."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    last = upto[-1]
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node is last:
            break
    graph.output(tuple(env[n] for n in upto))
    out = torch.fx.GraphModule(gm, graph)
    out.meta = {k: v for k, v in getattr(gm, "meta", {}).items() if k != "kiln.graph_id"}
    return out


def first_divergent_node(gm: torch.fx.GraphModule, args: list, backend: Callable,
                         rtol: float = 1e-3, atol: float = 1e-3) -> str | None:
    """The first node (by graph order) whose value, compiled by `backend`, differs from eager; None if none."""
    env: dict = {}
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]  # prefixes compile for inference

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            env[n] = super().run_node(n)
            return env[n]

    with torch.no_grad():
        Recorder(gm).run(*_clone(args))
    nodes = _tensor_nodes(gm, env)

    def diverges(k: int) -> torch.fx.Node | None:
        upto = nodes[:k]
        part = prefix_graph(gm, upto)
        compiled = backend(part, _clone(args))
        with torch.no_grad():
            outs = compiled(*_clone(args))
        for n, value in zip(upto, outs):
            if compare(value, env[n], rtol, atol) is not None:
                return n
        return None

    lo, hi = 1, len(nodes)
    if not nodes or diverges(hi) is None:
        return None
    while lo < hi:  # the shortest diverging prefix
        mid = (lo + hi) // 2
        if diverges(mid) is not None:
            hi = mid
        else:
            lo = mid + 1
    node = diverges(lo) or nodes[lo - 1]
    return f"{node.name} = {node.format_node()}"


# ------------------------------------------------------------------------------------------
# The repro writer
# ------------------------------------------------------------------------------------------

def _spec(t: torch.Tensor) -> str:
    dtype = str(t.dtype)
    make = "torch.randn" if t.is_floating_point() or t.is_complex() else "torch.zeros"
    grad = ", requires_grad=True" if t.requires_grad else ""
    return f"{make}({tuple(t.shape)}, dtype={dtype}, device={str(t.device)!r}{grad})"


def _import_line(name: str, value: Any) -> str | None:
    if name in ("torch", "inf", "nan", "device") or name.startswith("_"):
        return None
    module = getattr(value, "__module__", None)
    qual = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(value, type(torch)):
        return f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}"
    if module and qual:
        try:
            obj = importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
            if obj is value:
                return f"{name} = importlib.import_module({module!r}).{qual}"
        except (ImportError, AttributeError):
            pass
    return f"{name} = None  # {value!r}: not importable; fill in by hand"


def write_repro(gm: torch.fx.GraphModule, args: list, path: Path, note: str = "") -> Path:
    """A standalone script: `gm` as a module with random parameters of the same shapes, its inputs' shapes,
    and a comparison of eager against `kiln.compile(..., backend=<--backend, default inductor>)`."""
    code = gm.graph.python_code(root_module="self")
    imports = sorted({line for name, value in code.globals.items() if (line := _import_line(name, value))})
    attrs = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor):
                kind = "torch.nn.Parameter" if isinstance(value, torch.nn.Parameter) else ""
                attrs.append(f"        self.{node.target} = {kind}({_spec(value.detach())})"
                             if kind else f"        self.{node.target} = {_spec(value.detach())}")
    body = code.src.strip().splitlines()
    inputs = [_spec(a) if isinstance(a, torch.Tensor) else repr(a) for a in args]
    lines = [
        '"""kiln repro: ' + (note or "a captured graph") + '\n\nRun: python this_file.py [--backend inductor]\n"""',
        "import argparse", "import importlib", "", "import torch", "from torch import device, inf, nan", "",
        "import kiln", *imports, "", "",
        "class Repro(torch.nn.Module):", "    def __init__(self):", "        super().__init__()",
        *(attrs or ["        pass"]), "",
        *["    " + line for line in body], "", "",
        "def main():",
        "    parser = argparse.ArgumentParser()",
        "    parser.add_argument('--backend', default='inductor')",
        "    parser.add_argument('--atol', type=float, default=1e-3)",
        "    options = parser.parse_args()",
        "    torch.manual_seed(0)",
        "    model = Repro()",
        f"    args = [{', '.join(inputs)}]",
        "    with torch.no_grad():",
        "        expected = model(*args)",
        "        actual = kiln.compile(model, backend=options.backend)(*args)",
        "    flat_actual = torch.utils._pytree.tree_flatten(actual)[0]",
        "    flat_expected = torch.utils._pytree.tree_flatten(expected)[0]",
        "    for i, (a, e) in enumerate(zip(flat_actual, flat_expected)):",
        "        if isinstance(a, torch.Tensor):",
        "            err = (a.double() - e.double()).abs().max().item() if a.numel() else 0.0",
        "            print(f'output {i}: max abs error {err:.3g}', 'OK' if err <= options.atol else 'MISMATCH')",
        "", "",
        "if __name__ == '__main__':", "    main()", ""]
    # as the debug directory's files: a checked 0700 folder, a new file renamed into place (never through a symlink)
    path = _tree.folder(path.parent) / path.name
    write_atomic(path, "\n".join(lines))
    return path

"""Shrink a failing program while it keeps failing the same way, so it can become a named regression test.

The minimizer edits the program's syntax tree: it drops statements of `f` (at any depth), replaces an
`if`/`for`/`with` by its body, returns None, drops elements of the returned tuple or list (a returned
dict becomes a tuple), drops inputs (a parameter of `f` with its element of `inputs()`, or a line of `inputs()`),
drops `before_call`, and lowers CALLS. An edit is kept when the program still ends with the same status and kind (say
"wrong [aliasing]" or "crash [raise:NameError]"); it stops when no edit is kept.
"""
from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator

from tests.fuzz.compare import Outcome


def _bodies(node: ast.AST) -> Iterator[list]:
    """Every statement list inside `node` (function body, if/else branches, loop bodies)."""
    for field in ("body", "orelse"):
        stmts = getattr(node, field, None)
        if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
            yield stmts
            for s in stmts:
                yield from _bodies(s)


def _function(tree: ast.Module, name: str):
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _edits(tree: ast.Module) -> Iterator[Callable[[ast.Module], None]]:
    """Candidate edits, each a function applying itself to a copy of `tree` (addressed by position)."""
    f = _function(tree, "f")
    for b, stmts in enumerate(_bodies(f)):
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, ast.Return):
                continue
            yield lambda t, b=b, i=i: _replace(t, b, i, [])
            if isinstance(stmt, (ast.If, ast.For, ast.With)):
                yield lambda t, b=b, i=i: _replace(t, b, i, "body")
    ret = f.body[-1]
    if isinstance(ret, ast.Return) and isinstance(ret.value, (ast.Tuple, ast.List)) and len(ret.value.elts) > 1:
        for i in range(len(ret.value.elts)):
            yield lambda t, i=i: _function(t, "f").body[-1].value.elts.pop(i)
    if isinstance(ret, ast.Return) and not (isinstance(ret.value, ast.Constant) and ret.value.value is None):
        yield lambda t: setattr(_function(t, "f").body[-1], "value", ast.Constant(None))
    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
        yield lambda t: setattr(_function(t, "f").body[-1], "value", ast.Tuple(list(ret.value.values), ast.Load()))
    for i in range(len(f.args.args)):
        yield lambda t, i=i: _drop_input(t, i)
    make = _function(tree, "inputs")
    for i in range(2, len(make.body) - 1):  # keep the generator, the sizes and the return
        yield lambda t, i=i: _function(t, "inputs").body.pop(i)
    if _function(tree, "before_call"):
        yield lambda t: t.body.remove(_function(t, "before_call"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "CALLS" and node.value.value > 1:
            yield lambda t, n=node.value.value: _set_calls(t, n - 1)


def _drop_input(tree: ast.Module, i: int) -> None:
    """Drop parameter i of f and element i of the list `inputs` returns."""
    _function(tree, "f").args.args.pop(i)
    _function(tree, "inputs").body[-1].value.elts.pop(i)


def _replace(tree: ast.Module, body_index: int, i: int, new) -> None:
    stmts = list(_bodies(_function(tree, "f")))[body_index]
    old = stmts[i]
    stmts[i:i + 1] = old.body if new == "body" else new
    if not stmts:
        stmts.append(ast.Pass())


def _set_calls(tree: ast.Module, n: int) -> None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "CALLS":
            node.value = ast.Constant(n)


def minimize(source: str, run: Callable[[str], Outcome], note: str = "") -> tuple[str, Outcome]:
    """The smallest program found that `run` classifies like `source` (and its outcome)."""
    target = run(source)
    if target.status == "ok":
        return source, target
    tree = ast.parse(source)
    start = 0  # edits before `start` failed on an earlier tree: try them again only in a last full pass
    while True:
        edits = list(_edits(tree))
        for k in range(start, len(edits)):
            candidate = copy.deepcopy(tree)
            try:
                edits[k](candidate)
                text = ast.unparse(candidate)
            except (IndexError, ValueError, AttributeError):
                continue
            try:
                outcome = run(text)
            except Exception:  # noqa: BLE001 - the edit broke the program's inputs: not a smaller program
                continue
            if (outcome.status, outcome.kind) == (target.status, target.kind):
                tree, target, start = candidate, outcome, k
                break
        else:
            if start == 0:
                break
            start = 0
    header = f"# kiln fuzz program, minimized{(' from ' + note) if note else ''}\n"
    return header + ast.unparse(tree) + "\n", target

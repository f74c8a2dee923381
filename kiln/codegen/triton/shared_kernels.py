"""Kernels that are the same up to names are compiled once: the later ones become names of the first.

A graph repeats its layers: ResNet-50's 16 bottlenecks, DenseNet's 58 dense layers, a transformer's blocks.
Their fusion groups print the same kernel but for the kernel's name, its arguments' names (the buffers it
reads and writes) and its docstring (which names them too). Triton compiles each `@triton.jit` function
by its source, so every copy was compiled again: 56 kernels for ResNet-50's inference graph where 24
differ, 775 compiles for DenseNet-121's training step where 472 do. Arguments are passed by position
(kiln/codegen/triton/launch.py), so a kernel equal to an earlier one up to those names computes the same
thing on its own arguments: it is bound to the earlier function, and its launcher keeps its own
configuration (a different block size or warp count is a compile of its own, as before).
"""
from __future__ import annotations

import ast


def share_identical_kernels(source: str) -> str:
    """`source` (a kernel module) with each `@triton.jit` function that equals an earlier one up to its name,
    its arguments' names and its docstring replaced by an assignment of the earlier one to its name."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    first_of: dict[str, str] = {}
    shared = []
    for node in tree.body:
        if not _is_jit_function(node):
            continue
        start, end = node.decorator_list[0].lineno - 1, node.end_lineno
        first = first_of.setdefault(_up_to_names("".join(lines[start:end])), node.name)
        if first != node.name:
            shared.append((start, end, f"{node.name} = {first}  # the same kernel up to names: compiled once\n"))
    for start, end, line in reversed(shared):
        lines[start:end] = [line]
    return "".join(lines)


def _is_jit_function(node: ast.stmt) -> bool:
    if not isinstance(node, ast.FunctionDef) or len(node.decorator_list) != 1:
        return False
    d = node.decorator_list[0]
    return isinstance(d, ast.Attribute) and d.attr == "jit" and isinstance(d.value, ast.Name) and d.value.id == "triton"


def _up_to_names(text: str) -> str:
    """The function in `text` as a syntax tree with its name, its arguments' names and its docstring taken
    out: equal for two functions that compute the same from their arguments by position."""
    fn = ast.parse(text).body[0]
    renamed = {a.arg: f"arg{k}" for k, a in enumerate(fn.args.args)}
    fn.name = "kernel"
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        fn.body = body[1:]
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in renamed:
            node.id = renamed[node.id]
        elif isinstance(node, ast.arg) and node.arg in renamed:
            node.arg = renamed[node.arg]
    return ast.dump(fn, include_attributes=False)

"""Kernels that are the same up to names are compiled once: the later ones become names of the first.

A graph repeats its layers: ResNet-50's 16 bottlenecks, DenseNet's 58 dense layers, a transformer's blocks.
Their fusion groups print the same kernel but for the kernel's name, its arguments' names (the buffers it
reads and writes) and its docstring (which names them too). Triton compiles each `@triton.jit` function
by its source, so every copy was compiled again (benchmarks/results/compile_time counts them). Arguments are
passed by position (kiln/codegen/triton/launch.py), so a kernel equal to an earlier one up to those names
computes the same thing on its own arguments: it is bound to the earlier function, and its launcher keeps its
own configuration (a different block size or warp count is a compile of its own, as before).
"""
from __future__ import annotations

import re

_DEF = re.compile(r"def (\w+)\((.*)\):$")
# a function's text split at its identifiers (and numbers), which land at the odd positions: the arguments are
# renamed where a word equals one (one pattern for every kernel, not one compiled per kernel from its names)
_WORDS = re.compile(r"(\w+)")


def share_identical_kernels(source: str) -> str:
    """`source` (a kernel module) with each `@triton.jit` function that equals an earlier one up to its name,
    its arguments' names and its docstring replaced by an assignment of the earlier one to its name.

    Read as text, not parsed: kiln prints every function as `@triton.jit`, a one-line `def`, and an indented
    body that ends where a line starts at column 0 (a module of a big graph has tens of thousands of lines,
    and Python's parser took seconds over them)."""
    lines = source.splitlines(keepends=True)
    out, first_of, k = [], {}, 0
    while k < len(lines):
        end = _function_end(lines, k)
        if end is None:
            out.append(lines[k])
            k += 1
            continue
        name, key = _up_to_names(lines[k + 1:end])
        first = first_of.setdefault(key, name)
        if first == name:
            out += lines[k:end]
        else:
            out.append(f"{name} = {first}  # the same kernel up to names: compiled once\n")
            out += [line for line in lines[k + 1:end] if not line.strip()][-2:]  # the blank lines after it
        k = end
    return "".join(out)


def _function_end(lines: list[str], k: int) -> int | None:
    """Where the `@triton.jit` function starting at line `k` ends (the index after it), or None if none starts
    there in kiln's form."""
    if lines[k].rstrip() != "@triton.jit" or k + 1 >= len(lines) or not _DEF.match(lines[k + 1].rstrip()):
        return None
    end = k + 2
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t"):
        end += 1
    return end


def _up_to_names(function: list[str]) -> tuple[str, str]:
    """(name, key) of a function (its `def` line and body): the key is its text with its name, docstring and
    comments taken out and its arguments renamed by position, equal for two functions that compute the same from their
    arguments."""
    name, params = _DEF.match(function[0].rstrip()).groups()
    names = [p.split(":")[0].strip() for p in params.split(",") if p.strip()]
    body = [_code(line) for line in function[1:] if line.strip() and not line.lstrip().startswith("#")]
    if body and body[0].lstrip().startswith('"""'):  # the docstring: one line, or up to its closing quotes
        end = 0 if len(body[0].strip()) > 3 and body[0].rstrip().endswith('"""') else next(
            (j for j in range(1, len(body)) if body[j].rstrip().endswith('"""')), len(body) - 1)
        body = body[end + 1:]
    renamed = {n: f"arg{j}" for j, n in enumerate(names)}
    text = "\n".join([params, *body])
    parts = _WORDS.split(text)
    parts[1::2] = [renamed.get(word, word) for word in parts[1::2]]
    return name, "".join(parts)


def _code(line: str) -> str:
    """`line` without a trailing comment (comments name buffers too); kept whole where a quote could hold a `#`
    (two such kernels then just stay apart)."""
    code, mark, _ = line.rstrip().partition("  # ")
    return code if mark and "'" not in code and '"' not in code else line.rstrip()

"""Sources: where a value the graph depends on lives, written as a Python expression.

A guard reads `source.expr()` to check a value on the next call; the output
program reads it to fetch a graph input or to replay a side effect. Expressions
are evaluated with `L` (the frame's inputs: arguments, or stack and locals for a
continuation) and `G` (the function's globals) in scope.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


class Source:
    def expr(self) -> str:
        raise NotImplementedError

    def name(self) -> str:
        """A short identifier for graph placeholder names: L['self'].fc1.weight -> self_fc1_weight."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.expr()


@dataclass(frozen=True)
class LocalSource(Source):
    local: str

    def expr(self) -> str:
        return f"L[{self.local!r}]"

    def name(self) -> str:
        return self.local


@dataclass(frozen=True)
class GlobalSource(Source):
    global_name: str

    def expr(self) -> str:
        return f"G[{self.global_name!r}]"

    def name(self) -> str:
        return self.global_name


@dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    attr: str
    module_dict: str | None = None  # "_parameters", "_buffers" or "_modules" when read off an nn.Module

    def expr(self) -> str:
        return self.expr_from(self.base.expr(), fast=False)

    def expr_from(self, base: str, fast: bool = True) -> str:
        """The expression given its base's expression; `fast` reads module entries from their dict
        (`m._parameters['w']`), skipping nn.Module.__getattr__ on the hot path."""
        if fast and self.module_dict is not None:
            return f"{base}.{self.module_dict}[{self.attr!r}]"
        if self.attr.isidentifier():
            return f"{base}.{self.attr}"
        return f"getattr({base}, {self.attr!r})"

    def name(self) -> str:
        return f"{self.base.name()}_{self.attr}"


@dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: object  # an int, str or other literal with a faithful repr
    # the stored item of a dict subclass whose own __getitem__ computes something else (transformers' ACT2FN
    # builds a module per lookup): read with dict's own lookup, as capture read it
    stored: bool = False

    def expr(self) -> str:
        return self.expr_from(self.base.expr())

    def expr_from(self, base: str, fast: bool = True) -> str:
        return f"dict.__getitem__({base}, {self.key!r})" if self.stored else f"{base}[{self.key!r}]"

    def name(self) -> str:
        return f"{self.base.name()}_{self.key}"


@dataclass(frozen=True)
class ClosureSource(Source):
    """A closure cell of the compiled function, `C[i]` (its contents: `C[i].cell_contents`)."""

    index: int
    var: str

    def expr(self) -> str:
        return f"C[{self.index}]"  # the cell; its contents are AttrSource(self, "cell_contents")

    def name(self) -> str:
        return self.var


@dataclass(frozen=True)
class ConstantSource(Source):
    """An object kiln put in the program's namespace under `key` (a module object, a class)."""

    key: str

    def expr(self) -> str:
        return self.key

    def name(self) -> str:
        return self.key.strip("_")


@dataclass(frozen=True)
class ScalarTensorSource(Source):
    """An int or float input passed to the graph as a 0-d tensor (`___as_tensor(L['n'])`): once its value has
    changed between calls, tensor arithmetic on it stays in one graph for every value (automatic dynamic)."""

    base: Source

    def expr(self) -> str:
        return self.expr_from(self.base.expr())

    def expr_from(self, base: str, fast: bool = True) -> str:
        return f"___as_tensor({base})"

    def name(self) -> str:
        return f"{self.base.name()}_tensor"


@dataclass(frozen=True)
class SizeFloatSource(Source):
    """A float computed from sizes and int inputs (`math.sqrt(x.size(1))`, written over `L`), passed to the graph
    as a 0-d float64 tensor where it meets a floating-point tensor: the program computes it from this call's
    sizes, so it needs no guard, and kernels read it as a tensor."""

    python: str

    def expr(self) -> str:
        return f"___as_tensor({self.python})"

    def name(self) -> str:
        return "size_float"


@dataclass(frozen=True)
class ArithmeticSource(Source):
    """An int computed from an int input and a literal (`L['n'] % 2`): a value read as a dim or a size is
    guarded as this expression, so the input itself may change as long as the expression keeps its value."""

    base: Source
    template: str  # the expression with `{}` where the base goes: "({} % 2)", "(3 - {})"

    def expr(self) -> str:
        return self.expr_from(self.base.expr())

    def expr_from(self, base: str, fast: bool = True) -> str:
        return self.template.format(base)

    def name(self) -> str:
        return f"{self.base.name()}_expr"


def fast_expr(source: Source) -> str:
    """`source.expr()` with module entries read from their dicts all along the chain (for hot paths)."""
    base = getattr(source, "base", None)
    return source.expr_from(fast_expr(base)) if base is not None else source.expr()


def shared_fetches(sources: list[Source], prefix: str = "___s") -> tuple[list[str], list[str]]:
    """Expressions for `sources` with every chain prefix that two or more of them go through read
    once into a local: (the lines binding those locals, each source's expression over them).

    A deep model passes hundreds of parameters and buffers to the graph; spelled out in full, each
    walks `L['self']._modules['layer3']._modules['2']...` again, on every call
    (benchmarks/guard_overhead.py measures it)."""
    uses: Counter = Counter()
    for source in dict.fromkeys(sources):
        base = getattr(source, "base", None)
        while base is not None:
            uses[base] += 1
            base = getattr(base, "base", None)
    lines: list[str] = []
    names: dict[Source, str] = {}

    def expr(source: Source) -> str:
        if source in names:
            return names[source]
        base = getattr(source, "base", None)
        text = source.expr() if base is None else source.expr_from(expr(base))
        if uses[source] < 2:
            return text
        names[source] = f"{prefix}{len(names)}"
        lines.append(f"{names[source]} = {text}")
        return names[source]

    return lines, [expr(source) for source in sources]

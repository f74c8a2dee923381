"""The output program: generated Python that replaces the user's frame.

For each capture kiln writes one function, `def program(L, G, C)`, that
1. calls the compiled graph with its inputs fetched by source,
2. rebuilds every Python value still needed (stack, locals, return value),
3. replays side effects in program order,
4. then either returns, or runs the breaking instruction natively and calls
   the continuation (the rest of the function, compiled lazily) with the live
   stack and locals.
When the graph raises, no side effect has been replayed yet, and the frame may be re-run
eagerly (kiln.capture.rerun).
It is readable Python: `print(entry.program_source)` or the `bytecode` log.
"""
from __future__ import annotations

import itertools
import re
from typing import Any

import torch

from kiln.capture import rerun
from kiln.capture.sources import fast_expr, shared_fetches
from kiln.capture.values.base import NULL, Value
from kiln.capture.values.constant import ConstantValue, is_literal
from kiln.capture.values.torch_api import GradModeRestore
from kiln.size_python import SIZE_NAMES, size_source


class ProgramWriter:
    def __init__(self, state):
        self.state = state
        self.namespace: dict[str, Any] = dict(state.guards.namespace)
        self.lines: list[str] = []
        self.outputs: list = []  # fx nodes the graph must return, in order
        self._output_index: dict = {}
        self._constants: dict[int, str] = {}
        self._temps = itertools.count()
        self._memo: dict[int, str] = {}
        self._bound_symbols: set[str] = set()
        self.symbol_lines: list[str] = []  # the symbols' values, read from the inputs before the graph runs
        self._after_values: list = []  # lines written once every value is rebuilt (see `after_values`)
        self.symbol_lines: list[str] = []  # the symbols' values, read from the inputs as passed
        self.reentries: list = []  # blocks live at the break, entered again around the breaking instruction
        self.grad_outside_blocks: bool | None = None

    # --- expressions ------------------------------------------------------------------------
    def constant(self, value: Any) -> str:
        if is_literal(value) and not _holds_frozenset(value):
            return repr(value)
        key = self._constants.get(id(value))
        if key is None:
            name = getattr(value, "__name__", type(value).__name__)
            key = f"___{''.join(c if c.isalnum() else '_' for c in str(name))}_{len(self.namespace)}"
            self._constants[id(value)] = key
            self.namespace[key] = value
        return key

    def source_expr(self, source) -> str:
        return source.expr()

    def tensor(self, value) -> str:
        """A tensor from the graph: one of its outputs (or its input, fetched by source)."""
        node = value.node
        if node.op == "placeholder" and value.source is not None:
            return value.source.expr()
        if node not in self._output_index:
            self._output_index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"___out[{self._output_index[node]}]"

    def symbolic(self, sym) -> str:
        """A symbolic size as Python over the inputs' sizes: `L['x'].size(0) * 2`. The sizes are read
        before the graph runs (`symbol_lines`): an in-place view op of the graph (`x.unsqueeze_(0)`,
        `x.t_()`) changes the input's sizes, and a symbol stands for the size as passed."""
        expr = sym.node.expr
        for symbol in sorted(expr.free_symbols, key=str):
            source, dim = self.state.graph.symbol_sources[symbol]
            name = str(symbol)
            if name not in self._bound_symbols:
                self._bound_symbols.add(name)
                read = fast_expr(source) if dim is None else f"{fast_expr(source)}.size({dim})"  # an int input
                self.symbol_lines.append(f"{name} = {read}")
        for name, value in SIZE_NAMES.items():  # a rounded size prints as `math.ceil(s0 / 2)`
            self.namespace.setdefault(name, value)
        return f"({size_source(expr)})"

    def grad_mode_exit(self, prev: bool) -> str:
        return f"{self.constant(GradModeRestore)}({prev!r})"

    def reentry(self, reentry, grad_outside: bool) -> str:
        """A block the breaking instruction runs inside (`values.torch_api.Reentry`), outermost first;
        `grad_outside`: the grad mode where it was entered (the outermost's is set before entering them)."""
        if not self.reentries:
            self.grad_outside_blocks = grad_outside
        self.reentries.append(reentry)
        return self.constant(reentry)

    def value(self, v: Value) -> str:
        """Rebuild `v` once into a temporary, so aliasing between stack and locals survives."""
        if v is NULL:
            raise AssertionError("NULL is not a value")
        key = id(v)
        if key not in self._memo:
            expr = v.reconstruct(self)
            if expr.isidentifier() or _is_simple(expr) or _is_literal_value(v):
                self._memo[key] = expr
            else:
                temp = f"___t{next(self._temps)}"
                self.lines.append(f"{temp} = {expr}")
                self._memo[key] = temp
        return self._memo[key]

    def declare(self, v: Value, expr: str) -> str:
        """Bind `v` to a temporary holding `expr` now, before its parts are rebuilt, so a value
        that (through a closure cell) contains itself is rebuilt as one object."""
        temp = self.temp()
        self.lines.append(f"{temp} = {expr}")
        self._memo[id(v)] = temp
        return temp

    def after_values(self, line) -> None:
        """`line()` is written once the values are rebuilt (filling a declared value's parts)."""
        self._after_values.append(line)

    def finish_values(self) -> None:
        while self._after_values:
            self.lines.append(self._after_values.pop(0)())

    def before_effects(self, v: Value) -> str:
        """`v` for a replayed side effect. A value found at a path into the user's objects
        (`L['kwargs']['past_key_values']`) is read into a temporary ahead of every effect: an earlier
        effect may delete or rebind what the path goes through (`kwargs['cache'] = kwargs.pop('past_key_values')`).
        A value made during capture is rebuilt once, like every value (`self.a = self.b = []` stores one list)."""
        if getattr(v, "source", None) is None:
            return self.value(v)
        path = v.reconstruct(self)
        key = ("before effects", path)  # one read per path, however many values were found there
        if key not in self._memo:
            self._memo[key] = self.temp()
            self.lines.append(f"{self._memo[key]} = {path}")
        return self._memo[key]

    def temp(self) -> str:
        return f"___t{next(self._temps)}"

    def emit(self, line: str) -> None:
        self.lines.append(line)


def records_grad_inside(state) -> bool:
    """Whether the graph is entered with grad mode off and turns it on inside (see `write_program`)."""
    return not state.entry_grad_enabled and state.graph.enables_grad and not torch.is_inference_mode_enabled()


def _is_literal_value(v: Value) -> bool:
    """An immutable literal (`3`, `'a'`): written in place, it needs no temporary for its identity. A frozenset
    is written as a call, which makes a new object each time it runs: one temporary keeps it one object."""
    return isinstance(v, ConstantValue) and v.source is None and is_literal(v.value) and not _makes_set(v.value)


def _makes_set(value) -> bool:
    return isinstance(value, frozenset) or isinstance(value, tuple) and any(map(_makes_set, value))


def _is_simple(expr: str) -> bool:
    """An expression that reads the same before and after the replayed side effects: a frame input itself
    (`L['x']`, which no effect rebinds), a graph output, a singleton. A path into an object (`L['d']['k']`,
    `L['self'].w`) is read into a temporary instead: an effect may delete or rebind what it goes through."""
    return _FRAME_INPUT.fullmatch(expr) is not None or expr.startswith("___out[") or expr in ("None", "True", "False")


_FRAME_INPUT = re.compile(r"L\[('[^'\\]*'|\"[^\"\\]*\")\]")


def write_program(state, *, graph_fn_name: str, finish, rerunnable: bool) -> tuple[str, ProgramWriter]:
    """The program's source. `finish(writer)` rebuilds the values it needs and returns the tail lines.

    Values are rebuilt (into temporaries) before any side effect is replayed, so a value read
    before a mutation keeps its old identity; rebuilding also decides which graph nodes become
    graph outputs, so the graph call is written last, on top.

    `rerunnable`: the frame can be run again eagerly from its start (a function's entry, or a continuation
    stepped through natively), which it is when its graph raises (see `kiln.capture.rerun`).
    """
    writer = ProgramWriter(state)
    tail = finish(writer)
    effects = [effect.render(writer) for effect in state.side_effects.effects]
    writer.finish_values()
    head = []
    enters_grad = records_grad_inside(state)
    if state.graph.op_count or writer.outputs:
        fetches, inputs = shared_fetches([source for source, _ in state.graph.inputs])
        # A graph entered with grad mode off that turns it on inside (`with torch.enable_grad():`, or the
        # continuation after a break inside `with torch.no_grad():`) is called with grad mode on and
        # starts by turning it off: a backend decides from the mode it is called in whether to record
        # gradients at all (kiln's AOT autograd does), so its grad-enabled part must be seen.
        call = ["torch._C._set_grad_enabled(True)"] if enters_grad else []
        head += fetches + call + _graph_call(writer, f"{graph_fn_name}({', '.join(inputs)})", inputs, rerunnable)
    if state.grad_enabled != state.entry_grad_enabled or enters_grad:
        head.append(f"torch._C._set_grad_enabled({state.grad_enabled})")
    writer.namespace["torch"] = torch
    lines = writer.symbol_lines + head + writer.lines + effects + tail
    source = "def program(L, G, C):\n" + "\n".join("    " + line for line in lines)
    return source, writer


def _graph_call(writer: ProgramWriter, call: str, inputs: list[str], rerunnable: bool) -> list[str]:
    """`___out = graph(...)`, and what the program does when the graph raises (`kiln.capture.rerun`):
    it restores grad mode and autocast and tells the frame whether re-running it eagerly reproduces
    eager. For that it reads, before the call, the version counters of the inputs the graph writes
    (and copies them, when an op of the graph may raise on values), the generators' state (when the
    graph draws random numbers) and the autocast state (when the graph enters autocast)."""
    graph = writer.state.graph
    lines, args = [], [repr(writer.state.entry_grad_enabled), writer.constant(writer.state.entry_autocast)]
    if rerunnable and not graph.uses_private_generator:
        if graph.rng_devices:
            cuda = tuple(sorted(d for d in graph.rng_devices if d != "cpu"))
            lines.append(f"___rng = {writer.constant(rerun.rng_state)}({cuda!r})")
        written = [expr for expr, writes in zip(inputs, graph.written_inputs()) if writes]
        if written:
            lines.append(f"___versions = {writer.constant(rerun.input_versions)}({', '.join(written)})")
            if graph.checks_values:
                lines.append(f"___saved = {writer.constant(rerun.snapshot_inputs)}({', '.join(written)})")
                args.append("saved=___saved")
        args[2:2] = ["___rng" if graph.rng_devices else "None", f"({''.join(w + ', ' for w in written)})",
                     "___versions" if written else "()"]
    if graph.enters_autocast:
        lines.append(f"___autocast = {writer.constant(rerun.autocast_snapshot)}()")
        args.append("autocast=___autocast")
    if writer.state.in_python_block:
        args.append("in_python_block=True")
    return lines + ["try:", f"    ___out = {call}", "except Exception as ___e:",
                    f"    {writer.constant(rerun.graph_raised)}(___e, {', '.join(args)})"]


def _holds_frozenset(value: Any) -> bool:
    """A frozenset iterates in an order its making decided (a set of the same items made otherwise may iterate
    otherwise), so one is passed as the object itself, not rebuilt from its repr."""
    if type(value) is frozenset:
        return True
    return type(value) is tuple and any(map(_holds_frozenset, value))

"""The state one capture shares across all the frames it inlines.

One `CaptureState` per attempt at compiling a frame: the graph being built,
the guards installed so far, the side-effect log, the grad-mode and autocast
state as the traced code sees it, and the objects the output program and the
guards will need in their namespace. It is passed explicitly to everything
that needs it — there is no "current capture" global.

It is also the seam between the value trackers and the layers above them: a
tracker that meets a real object wraps it with `state.wrap` (builder.py), calls
a function kiln models with `state.call_builtin` (values/builtins.py) and
inlines a Python function with `state.inline` (interpreter.py), so the tracker
modules import none of those, and the imports at the top of each module say
what it depends on.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.amp.autocast_mode as amp

from kiln.capture import builder
from kiln.capture.graph import GraphBuilder
from kiln.capture.guards import HELPERS, Guard, GuardKind, GuardSet
from kiln.capture.interpreter import inline_call
from kiln.capture.side_effects import SideEffects
from kiln.capture.sources import ConstantSource, GlobalSource, ItemSource, Source
from kiln.capture.values.backend_switches import Switches
from kiln.capture.values.base import Value
from kiln.capture.values.builtins import HANDLERS, call_builtin
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.objects import object_value


class CaptureState:
    def __init__(self, L: dict, G: dict, C: tuple, break_at: int | None = None, opaque_inputs: bool = False,
                 dynamic: bool | None = None, auto_dynamic: dict | None = None, captures_scalars: bool = False):
        self.L, self.G, self.C = L, G, C
        # `t.item()` stays in the graph (values/items.py): torch.compile does so under fullgraph=True only
        self.captures_scalars = captures_scalars
        self.asked_compiling_at: int | None = None  # the root frame's first instruction that asked is_compiling()
        self.dynamic = dynamic  # kiln.compile(dynamic=...): True, False or None (automatic)
        self.auto_dynamic = auto_dynamic or {}  # source -> dims that changed size in an earlier call
        self.opaque_inputs = opaque_inputs  # wrap every input as opaque: no guards, every use breaks
        self.graph = GraphBuilder()
        self.guards = GuardSet()
        self.side_effects = SideEffects()
        self.switches = Switches()  # torch.backends switches read or written (values/backend_switches.py)
        self.break_at = break_at
        self.frames: list = []  # the interpreter's frame stack, innermost last
        # ids of the values a continuation starts with on its stack: the `__exit__` of a block it resumes in was
        # taken before this capture, from a manager the user's code holds (see opcodes.exceptions)
        self.inherited_stack: frozenset[int] = frozenset()
        # the graph runs inside (or enters) a block of a manager written in Python, whose `__exit__` may suppress or
        # replace what the graph raises: eager's outcome then differs from the graph's error by design
        self.in_python_block = False
        self.entry_grad_enabled = torch.is_grad_enabled()
        self.grad_enabled = self.entry_grad_enabled
        self.autocast_stack: list = []
        self.pending_globals: dict[tuple[int, str], object] = {}  # globals stored by traced code
        # optimizer.zero_grad() was recorded to run after the graph: a `.grad` read later in this graph
        # would see the grads it resets
        self.grads_reset = False
        self.specialized_scalars: list = []  # (source, value) of int inputs capture read the value of
        self.module_sources: set = set()  # sources of the nn.Modules wrapped (their ints stay specialized)
        # the frame's locals that are modules, by name: the instances an entry was compiled for, which its guards
        # (on the class, not the object) do not name; the recompile limit counts per instance (entry.CacheEntry)
        self.instances: dict[str, Any] = {}
        self.written_modules: list = []  # (module, source) of the modules traced code wrote attributes of
        self.mutable_values: dict = {}  # id(list or dict), or ("tensor", id) -> (its tracker, its first source)
        self._constant_ids: dict[int, str] = {}
        self.guards.add(Guard(GuardKind.GRAD_MODE, None, f"___grad_enabled() is {self.grad_enabled}",
                              str(self.grad_enabled), "___grad_enabled()"))
        inference = torch.is_inference_mode_enabled()
        self.inference_mode = int(inference)
        self.guards.add(Guard(GuardKind.GRAD_MODE, None, f"torch.is_inference_mode_enabled() is {inference}",
                              f"inference mode {inference}", "torch.is_inference_mode_enabled()"))
        self.entry_autocast = _autocast_state()
        self.guards.add(Guard(GuardKind.AUTOCAST, None, f"___autocast_state() == {self.entry_autocast!r}",
                              repr(self.entry_autocast), "___autocast_state()"))
        # torch.backends.cuda.matmul.allow_tf32: cuBLAS reads it per call, a compiled Triton matmul when built
        tf32 = torch._C._get_cublas_allow_tf32()
        self.guards.add(Guard(GuardKind.MATMUL_PRECISION, None, f"___tf32_matmuls() is {tf32}",
                              f"TF32 matmuls {tf32}", "___tf32_matmuls()"))

    @property
    def inference_mode(self) -> int:
        """The inference-mode blocks the traced code is in (what `is_inference_mode_enabled()` answers)."""
        return self._inference_mode

    @inference_mode.setter
    def inference_mode(self, depth: int) -> None:
        # the graph's fake ops run in the same mode, so that they make inference tensors where eager does
        self._inference_mode = depth
        self.graph.inference_mode = depth > 0

    # --- sources ---------------------------------------------------------------------------
    def source_expr(self, source: Source) -> str:
        return source.expr()

    def real_value(self, source: Source) -> Any:
        """The object at `source` in this call's inputs."""
        return eval(source.expr(), dict(self.guards.namespace), {"L": self.L, "G": self.G, "C": self.C})

    def constant_source(self, obj: Any, hint: str) -> ConstantSource:
        """A source for an object that has none in the frame: it is kept in the namespace."""
        key = self._constant_ids.get(id(obj))
        if key is None:
            key = f"___{''.join(c if c.isalnum() else '_' for c in hint)}_{len(self._constant_ids)}"
            self._constant_ids[id(obj)] = key
            self.guards.namespace[key] = obj
        return ConstantSource(key)

    def global_source(self, globals_: dict, name: str) -> Source:
        if globals_ is self.G:
            return GlobalSource(name)
        module = globals_.get("__name__", "module")
        return ItemSource(self.constant_source(globals_, f"globals_{module}"), name)

    # --- the seams: what trackers reach above them through ----------------------------------
    def wrap(self, obj: Any, source: Source) -> Value:
        """The tracker of a real object at `source`, with the guards it needs (builder.wrap)."""
        return builder.wrap(self, obj, source)

    def wrap_lazy(self, obj: Any, source: Source) -> Value:
        """The tracker of a real object at `source`, guarded only once it is used (builder.wrap_lazy)."""
        return builder.wrap_lazy(self, obj, source)

    def wrap_unsourced(self, obj: Any) -> Value:
        """The tracker of an object reached without a source (a class attribute, a builtin): no guards."""
        return object_value(obj, self)

    def guard_identity(self, obj: Any, source: Source) -> None:
        """Capture relied on the object at `source` being `obj` itself."""
        builder.guard_identity(self, obj, source, self.source_expr(source))

    def size_float_tensor(self, value: Value) -> Value:
        """A symbolic float as a 0-d float64 graph input computed from the call's sizes (builder)."""
        return builder.size_float_tensor(self, value)

    def module_written(self, module: Any, source: Source) -> None:
        """Traced code writes an attribute of `module` (builder.module_written)."""
        builder.module_written(self, module, source)

    def guard_hasattr(self, source: Source | None, name: str, present: bool) -> None:
        """Capture relied on `hasattr(obj, name)` being `present` (builder.guard_hasattr)."""
        builder.guard_hasattr(self, source, name, present)

    def answer_is_compiling(self) -> Value:
        """`torch.compiler.is_compiling()` (transformers' `is_torchdynamo_compiling()`): True, as under
        torch.compile. Where in the root frame it was asked is kept: code before a break that took the
        compiling path must not be resumed by native code that raises (see `entry.capture`)."""
        root = self.frames[0].current if self.frames else None
        index = root.index if root is not None else 0
        if self.asked_compiling_at is None or index < self.asked_compiling_at:
            self.asked_compiling_at = index
        return ConstantValue(True)

    def models(self, fn: Any) -> bool:
        """Whether kiln models calls of `fn` (values/builtins.py) rather than inlining or breaking."""
        return fn in HANDLERS

    def call_builtin(self, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """A call of a function kiln models without running it (values/builtins.py), else a break."""
        return call_builtin(self, fn, args, kwargs)

    def inline(self, fn, args: list, kwargs: dict):
        return inline_call(self, fn, args, kwargs)

    def current_frame(self):
        return self.frames[-1]

    # --- global state the graph changes ---------------------------------------------------
    def set_grad_enabled(self, enabled: bool) -> None:
        if enabled != self.grad_enabled:
            self.graph.set_grad_enabled(enabled)
            torch._C._set_grad_enabled(enabled)
            self.grad_enabled = enabled

    def enter_autocast(self, ctx) -> None:
        ctx.node = self.graph.graph.call_function(amp._enter_autocast, ctx.args)
        ctx.real = torch.autocast(ctx.args[0], dtype=ctx.args[1], enabled=ctx.args[2], cache_enabled=ctx.args[3])
        ctx.real.__enter__()
        self.autocast_stack.append(ctx)

    def exit_autocast(self, ctx) -> None:
        self.graph.graph.call_function(amp._exit_autocast, (ctx.node,))
        ctx.real.__exit__(None, None, None)
        self.autocast_stack.remove(ctx)

    def exit_autocast_in_graph(self) -> None:
        """The graph ends inside autocast blocks (a break): it leaves them, so it runs as one balanced region."""
        for ctx in reversed(self.autocast_stack):
            self.graph.graph.call_function(amp._exit_autocast, (ctx.node,))

    def restore_global_state(self) -> None:
        """Undo what tracing did to the process (grad mode, autocast) once capture ends."""
        for ctx in reversed(self.autocast_stack):
            ctx.real.__exit__(None, None, None)
        torch._C._set_grad_enabled(self.entry_grad_enabled)


def _autocast_state() -> tuple:
    return HELPERS["___autocast_state"]()



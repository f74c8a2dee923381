"""Frame entry: the compiling wrapper, the cache per frame, and the continuations.

`CompiledFrame` owns the cache entries of one frame — a function's entry, or a
continuation (the rest of a function after a graph break, starting at an
instruction with a given stack). A call checks each entry's guard function in
order and runs the first whose guards pass; otherwise it captures again
(logging which guard failed), up to `config.cache_size_limit` entries, after
which the frame runs eagerly with one warning.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import inspect
import itertools
import logging
import re
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from kiln import compiled_autograd, fallbacks
from kiln.capture import bytecode, eager_frames, routes, spellings, tensor_checks
from kiln.capture.breaks import GraphBreak, StepsNatively, Unresumable, backward_boundary
from kiln.capture.builder import guard_input_aliasing, wrap_lazy
from kiln.capture.guards import Guard, GuardKind, GuardSet
from kiln.capture.hooked_call import call_module_with_hooks, has_only_forward_hooks
from kiln.capture.interpreter import Frame, StopAtBreak
from kiln.capture.native import (
    FRAME_READERS,
    PROGRAM_FILE_PREFIX,
    calls_frame_reader,
    enter_with,
    exit_with,
    from_users_frame,
    raise_at,
    raised_at,
    read_in_frame,
    render_instruction,
    resumable_anywhere,
    within_handler,
)
from kiln.capture.output import records_grad_inside, write_program
from kiln.capture.rerun import GraphRaised, eager_error_type, restore_rng_state
from kiln.capture.sources import ClosureSource, LocalSource, fast_expr
from kiln.capture.state import CaptureState
from kiln.capture.tensor_frames import holds_torch_values
from kiln.capture.values.base import NULL
from kiln.capture.values.exceptions import TracebackRead
from kiln.capture.values.functions import CellValue
from kiln.capture.values.modules import any_global_hooks, hooks_run_natively
from kiln.capture.values.torch_api import ExitValue, GradModeContext, GradModeRestore, Reentry
from kiln.config import Config, config
from kiln.runtime import collector
from kiln.runtime.compile_lock import build_once, compile_lock

log_breaks = logging.getLogger("kiln.graph_breaks")
log_recompiles = logging.getLogger("kiln.recompiles")
log_guards = logging.getLogger("kiln.guards")
log_graph = logging.getLogger("kiln.graph")
log_program = logging.getLogger("kiln.bytecode")
log = logging.getLogger("kiln.capture")
_profiler = torch.autograd.profiler  # `_profiler._is_profiler_enabled`: a module global, cheap to read per call
_record_ids = itertools.count(1)

# Observers of the capture stage, installed by kiln.debug (nothing here imports it):
# each is called as listener(ctx, record) after a capture and its backend compile.
RECORD_LISTENERS: list[Callable[[CompileContext, CaptureRecord], None]] = []
# Wrappers of the backend call, installed by kiln.debug: hook(backend) -> backend. The minifier's
# (kiln/debug/minifier) writes a repro of a graph the backend fails on, and shrinks it on request.
BACKEND_HOOKS: list[Callable[[Callable], Callable]] = []


class Instrumentation:
    """Whether entry programs are timed (`python -m kiln run` turns it on); off, the call path only reads a flag."""

    timing: bool = False


instrumentation = Instrumentation()


class FullGraphError(RuntimeError):
    """`fullgraph=True` and the function has a graph break."""


class CannotResume(RuntimeError):
    """A continuation (which has no frame to run eagerly) met a break kiln cannot resume after."""


class BackendCompilerFailed(RuntimeError):
    """The backend raised while compiling a captured graph."""


@dataclass(frozen=True)
class FrameSpec:
    """What a compiled frame starts from: a code object at an instruction, with a stack layout."""

    code: types.CodeType
    start: int = 0
    stack_nulls: tuple[bool, ...] = ()
    local_names: tuple[str, ...] | None = None  # None: a function entry, locals are its arguments
    cell_names: tuple[str, ...] = ()
    # stepped through natively, instruction by instruction (its own cache): how a continuation whose graph
    # raised runs again eagerly from its start, having no Python function to call (see `kiln.capture.rerun`)
    native: bool = False

    def function(self) -> str:
        """The function this frame belongs to, continuations included: `name (file:line)`."""
        return f"{self.code.co_name} ({self.code.co_filename}:{self.code.co_firstlineno})"

    def describe(self) -> str:
        where = self.function()
        if self.start == 0 and self.local_names is None:
            return where
        line = bytecode.instructions(self.code)[self.start].lineno
        return f"{where}, resumed at line {line}" + (", natively" if self.native else "")

    def is_continuation(self) -> bool:
        return self.start != 0 or self.local_names is not None


@dataclass
class CaptureRecord:
    """What one capture produced, kept for explain() and reports."""

    frame: str
    graph: torch.fx.GraphModule | None
    op_count: int
    graph_break: GraphBreak | None
    guards: GuardSet
    program_text: str  # the output program (`program_source` puts the guard function before it)
    compile_seconds: float
    recompile_reason: str | None = None
    id: int = 0  # process-wide graph id, shown by the report, the debug directory and the profiler range
    name: str = ""  # the function's name
    function: str = ""  # the function with its file and line (`FrameSpec.function`), continuations included
    backend_seconds: float = 0.0  # the part of compile_seconds spent in the backend
    compiled: Any = None  # what the backend returned
    calls: int = 0  # calls of this entry's program and their time, counted while instrumentation is on
    run_seconds: float = 0.0

    @functools.cached_property
    def program_source(self) -> str:
        return readable_program(self.guards, self.program_text)



@dataclass
class CacheEntry:
    guard: Callable
    program: Callable | None  # None: run the frame eagerly (a break it cannot resume after)
    guards: GuardSet
    program_text: str  # the output program (`program_source` puts the guard function before it)
    record: CaptureRecord | None = None
    input_shapes: list = field(default_factory=list)  # (source, shape) of each tensor input, for automatic dynamic
    input_scalars: list = field(default_factory=list)  # (source, value) of each int input read as a constant
    # the module instances among the frame's locals it was captured for, by local name (weak: an entry does not
    # keep a model alive); its guards check their class, so other instances may run it too
    instances: dict[str, weakref.ref] = field(default_factory=dict)

    @functools.cached_property
    def program_source(self) -> str:
        return readable_program(self.guards, self.program_text)

    @functools.cached_property
    def _identity_check(self) -> Callable | None:
        """The guards on the identity of the frame's locals, compiled once (None: the entry has none)."""
        identities = self.guards.local_identities()
        return identities.compile() if identities.guards else None

    def compiled_for(self, L, G, C) -> bool:
        """Whether this entry was compiled for the objects this call's locals are (a module's `self`, the objects
        its identity guards name); an entry naming no local object was compiled for any."""
        if any(L.get(name) is not ref() for name, ref in self.instances.items()):
            return False
        return self._identity_check is None or bool(self._identity_check(L, G, C))


def readable_program(guards: GuardSet, program: str) -> str:
    """The guard function as a reader sees it (its tensor checks in Python), then the output program. Written
    when first read (a report, the debug directory, the `bytecode` log): a warm start reads neither."""
    return guards.source_code() + "\n\n" + program


@dataclass(eq=False)
class CompileContext:
    """Everything the `kiln.compile(...)` calls naming one backend own together (kiln.api): that backend, its
    options and the frames compiled for them."""

    backend: Callable
    fullgraph: bool = False
    dynamic: bool | None = None  # kiln.compile(dynamic=...): True, False or None (automatic dynamic)
    frames: dict[FrameSpec, CompiledFrame] = field(default_factory=dict)
    records: list[CaptureRecord] = field(default_factory=list)
    graph_counter: int = 0
    functions: dict[Any, CompiledFunction] = field(default_factory=dict)
    run_seconds: float = 0.0  # time in this context's programs (outermost calls), while instrumentation is on
    _thread: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def running(self) -> list:
        """Records whose programs run now in the calling thread (observed calls), outermost first.

        One stack per thread: calls from other threads neither nest in these nor end them.
        """
        stack = getattr(self._thread, "running", None)
        if stack is None:
            stack = self._thread.running = []
        return stack

    def frame(self, spec: FrameSpec) -> CompiledFrame:
        return build_once(self.frames, spec, CompiledFrame, spec, self)

    def function(self, fn: types.FunctionType) -> CompiledFunction:
        return build_once(self.functions, fn, CompiledFunction, fn, self)


class Continue(NamedTuple):
    """What a program returns to resume in a continuation: the caller's `CompiledFrame.__call__` runs it."""
    frame: CompiledFrame
    L: dict


class CompiledFrame:
    def __init__(self, spec: FrameSpec, ctx: CompileContext):
        self.spec, self.ctx = spec, ctx
        self.entries: list[CacheEntry] = []
        self.run_eagerly = False  # set when the frame cannot be captured; function entries only
        # set by a graph break inside a loop: from then on the frame is stepped through natively, its calls
        # compiled (torch.compile skips such a frame for good too)
        self.steps_natively = False
        self._warned_limit = False
        self.failures = 0  # captures that raised (see `_capture_failed`)
        self.auto_dynamic: dict = {}  # source -> dims whose size changed between calls (dynamic=None)

    def __call__(self, L: dict, G: dict, C: tuple, eager: Callable | None = None) -> Any:
        """Run this frame, then each continuation its program hands back, one after the other (a trampoline):
        a loop whose body breaks the graph resumes in a continuation per iteration, and calling each from
        the one before would nest a Python frame per iteration, a RecursionError where eager loops on."""
        result = self._step(L, G, C, eager)
        while type(result) is Continue:
            result = result.frame._step(result.L, G, C, None)
        return result

    def _step(self, L: dict, G: dict, C: tuple, eager: Callable | None) -> Any:
        """One program of this frame: its result, or the `Continue` it ends with."""
        # The fast path takes no lock: entries are only ever appended, each one complete.
        for entry in self.entries:
            if entry.guard(L, G, C):
                break
        else:
            entry = self._miss(L, G, C, eager)
            if entry is None:
                return self._run_eagerly(eager)
        if entry.program is None:  # an eager entry (see `_add_eager_entry`)
            return self._run_eagerly(eager)
        try:
            if instrumentation.timing or _profiler._is_profiler_enabled:
                return self._run_observed(entry, L, G, C)
            return entry.program(L, G, C)
        except GraphRaised as e:
            raised = e
        # outside the handler: what the re-run raises is the user's exception, not one raised "during" kiln's
        if eager is None and self.spec.is_continuation() and not self.spec.native:
            native = self.ctx.frame(replace(self.spec, native=True))
            eager = functools.partial(native, L, G, C)
        return self._after_graph_raised(raised, eager)

    def _after_graph_raised(self, raised: GraphRaised, eager: Callable | None) -> Any:
        """The graph raised before any side effect of this frame was replayed: run the frame eagerly
        from its start, which applies eager's side effects and raises eager's exception (see
        `kiln.capture.rerun`; a continuation is stepped through natively); or, when that would not be
        exact, raise the graph's exception."""
        error = raised.error
        if eager is None or not raised.rerunnable:
            raise error
        if raised.rewind is not None:
            raised.rewind()
        if raised.rng is not None:
            restore_rng_state(raised.rng)
        try:
            # kiln's own recovery, not the user's fallback: the breaks of a continuation stepped natively to
            # reproduce eager's raise are neither counted nor raised under KILN_STRICT
            with fallbacks.recovering():
                result = eager()
        except CannotResume:
            raise error from None  # as for a call that cannot be re-run: the graph's own exception
        except Exception as eager_error:
            if type(eager_error) is not eager_error_type(error) and not raised.in_python_block:
                self._warn_rerun(error, f"running it eagerly raised {type(eager_error).__name__} instead")
            raise
        if not raised.in_python_block:
            self._warn_rerun(error, "running it eagerly raised nothing, and its result is returned")
        return result

    def _warn_rerun(self, error: Exception, outcome: str) -> None:
        """The graph raised what eager does not (a bug of kiln's or of the backend): a fallback, said once."""
        fallbacks.record("frame", self.spec.describe(), f"the compiled graph raised {type(error).__name__}: "
                         f"{error}; {outcome}", stage="rerun")

    def _miss(self, L, G, C, eager: Callable | None) -> CacheEntry | None:
        """No entry's guards pass: the entry to run, compiled now, or None when the frame runs eagerly.

        One capture at a time (the compile lock); a thread that waited for the lock first looks for
        an entry another thread added meanwhile, so concurrent first calls compile once.
        """
        if self.run_eagerly:
            return None
        with compile_lock:
            for entry in self.entries:
                if entry.guard(L, G, C):
                    return entry
            return None if self.run_eagerly else self._compile(L, G, C, eager)

    def _compile(self, L, G, C, eager: Callable | None) -> CacheEntry | None:
        """Capture a new entry for this call (the compile lock held), or None: the frame runs eagerly."""
        reason = self.entries[-1].guards.first_failure(L, G, C) if self.entries else None
        if reason is not None:
            if self.ctx.dynamic is None:
                reason += self._mark_changed_sizes_dynamic(L, G, C)
            log_recompiles.info("recompiling %s: %s", self.spec.describe(), reason)
        opaque = self.spec.native or self.steps_natively
        if self._entries_for_these_objects(L, G, C) >= recompile_limit():
            if eager is not None:
                self._warn_limit(reason)
                self.run_eagerly = True
                return None
            opaque = True  # a continuation must still run: step through it natively, unguarded
        return self._capture(L, G, C, eager, opaque, reason)

    def _entries_for_these_objects(self, L, G, C) -> int:
        """The entries compiled for the objects this call's locals are (a module's `self`), as torch.compile
        counts its recompile limit: the twelve layers of a model whose code reads an attribute that differs
        between them (an entry per layer) do not use up each other's budget. Past `ACCUMULATED_LIMIT` entries in
        all, the frame counts as full."""
        if len(self.entries) < recompile_limit():
            return len(self.entries)
        if len(self.entries) >= ACCUMULATED_LIMIT:
            return len(self.entries)
        return sum(entry.compiled_for(L, G, C) for entry in self.entries)

    def _run_observed(self, entry: CacheEntry, L, G, C) -> Any:
        """Run `entry` as one named profiler range (when profiling) and count its time (when timing)."""
        record, ctx = entry.record, self.ctx
        ctx.running.append(record)
        start = time.perf_counter()
        try:
            if _profiler._is_profiler_enabled:
                with torch.profiler.record_function(f"kiln: {record.name} (graph {record.id})"):
                    return entry.program(L, G, C)
            return entry.program(L, G, C)
        finally:
            seconds = time.perf_counter() - start
            ctx.running.pop()
            record.calls += 1
            record.run_seconds += seconds
            if not ctx.running:
                ctx.run_seconds += seconds

    def _mark_changed_sizes_dynamic(self, L, G, C) -> str:
        """Automatic dynamic: dimensions whose size changed since the last capture become symbolic, int inputs
        whose value changed become SymInt inputs of the graph (`builder.is_symbolic_int`), and float inputs
        0-d tensor inputs where they meet tensors (`builder._scalar_tensor_maker`)."""
        changes = []
        last = self.entries[-1]
        for source, old_shape in last.input_shapes:
            try:
                new = eval(source.expr(), dict(last.guards.namespace), {"L": L, "G": G, "C": C})
            except Exception:
                continue
            if not isinstance(new, torch.Tensor) or new.dim() != len(old_shape):
                continue
            dims = {d for d, (a, b) in enumerate(zip(old_shape, new.shape)) if a != b}
            if dims - self.auto_dynamic.get(source, set()):
                self.auto_dynamic.setdefault(source, set()).update(dims)
                changes += [f"dimension {d} of {source.expr()} changed {old_shape[d]} -> {new.shape[d]}"
                            for d in sorted(dims)]
        for source, old_value in last.input_scalars:
            try:
                new = eval(source.expr(), dict(last.guards.namespace), {"L": L, "G": G, "C": C})
            except Exception:
                continue
            if type(new) is type(old_value) and new != old_value and ("scalar", source) not in self.auto_dynamic:
                self.auto_dynamic[("scalar", source)] = True
                changes.append(f"{source.expr()} changed {old_value} -> {new}")
        return f"; {', '.join(changes)}: now dynamic" if changes else ""

    def _run_eagerly(self, eager: Callable) -> Any:
        """The frame's own code, the modules it calls compiled (kiln.capture.eager_frames)."""
        return eager_frames.run_eagerly(functools.partial(call_nested, self.ctx), eager)

    def _add_eager_entry(self, guards: GuardSet, reason: str | None) -> None:
        """Inputs passing `guards` run the frame eagerly (a break it cannot resume after); others compile."""
        self.entries.append(CacheEntry(guards.compile(), None, guards, "# runs eagerly", None))
        log_recompiles.info("%s runs eagerly for inputs passing its guards (%s)", self.spec.describe(), reason)

    def _capture_failed(self, e: Exception, reason: str | None) -> None:
        """A capture raised (a bug, or a case kiln does not model): this call runs eagerly.

        A break capture meets again on the same path (it carries the guards of that path) becomes
        an eager entry. Any other failure may depend on what no guard describes (an input's rank):
        later calls try again, until `cache_size_limit` failures make the frame run eagerly for good.
        """
        self.failures += 1
        log.debug("capture failure", exc_info=True)
        fallbacks.record("frame", self.spec.describe(), e, stage="capture")
        if isinstance(getattr(e, "guards", None), GuardSet):
            self._add_eager_entry(e.guards, reason)
        elif self.failures >= recompile_limit():
            self.run_eagerly = True

    def _natively_for(self, guards: GuardSet, L, G, C, eager, reason: str | None) -> CacheEntry | None:
        """An entry stepping the frame through natively for the inputs passing `guards` (the path that met the
        break); others are captured again (a call with the attention mask the first call lacked)."""
        entry = self._capture(L, G, C, eager, True, reason, native=True)
        if entry is not None:
            self.entries[-1] = entry = replace(entry, guard=guards.compile(), guards=guards)
        return entry

    def _warn_limit(self, reason: str | None) -> None:
        if not self._warned_limit:
            self._warned_limit = True
            fallbacks.record("frame_limit", self.spec.describe(), f"hit config.cache_size_limit "
                             f"({recompile_limit()}); last recompile: {reason}", stage="guards")

    def _capture(self, L, G, C, eager, opaque: bool, reason: str | None, native: bool = False) -> CacheEntry | None:
        """Capture an entry for this call; `native` (or `steps_natively`): its continuations step natively too."""
        start = time.perf_counter()
        try:
            spec = replace(self.spec, native=True) if native or self.steps_natively else self.spec
            result = capture(spec, L, G, C, self.ctx, opaque, self.auto_dynamic)
        except (FullGraphError, BackendCompilerFailed, fallbacks.KilnStrictError):
            raise
        except StepsNatively as e:
            log_breaks.info("%s", e.message())
            fallbacks.record_break(e.reason.id, self.spec.describe(), e.message(), warn_key=self.spec.function())
            if e.for_good:
                self.steps_natively = True
                return self._capture(L, G, C, eager, True, reason)
            return self._natively_for(e.guards, L, G, C, eager, reason)
        except Unresumable as e:
            if eager is None and not opaque:
                # a continuation has no frame to run eagerly: it steps through natively from its start, which
                # enters the blocks after it natively too (a generator manager's block it breaks inside)
                log_breaks.info("%s", e.message())
                fallbacks.record_break(e.reason.id, self.spec.describe(), e.message(), resumable=False,
                                       warn_key=self.spec.function())
                self.steps_natively = True
                return self._capture(L, G, C, eager, True, reason)
            if eager is None:
                raise CannotResume(f"kiln cannot resume this frame after a graph break: {e}") from e
            self._add_eager_entry(e.guards, reason)
            log_breaks.info("%s", e.message())
            fallbacks.record_break(e.reason.id, self.spec.describe(), e.message(), resumable=False,
                                   warn_key=self.spec.function())
            return None
        except Exception as e:  # a failed capture never breaks the user's program
            if eager is None:
                if opaque:
                    raise
                # a continuation has no frame to run eagerly: step through it natively instead
                log.debug("capture failure", exc_info=True)
                fallbacks.record("frame", self.spec.describe(), f"{fallbacks.describe_exception(e)}; a continuation, "
                                 "stepped through natively", stage="capture", warn_key=self.spec.function())
                return self._capture(L, G, C, eager, True, reason)
            self._capture_failed(e, reason)
            return None
        entry, record = result
        record.compile_seconds = time.perf_counter() - start
        record.recompile_reason = reason
        for running in self.ctx.running:  # compiling a continuation inside a program is not time in compiled code
            running.run_seconds -= record.compile_seconds
        if self.ctx.running:
            self.ctx.run_seconds -= record.compile_seconds
        self.ctx.records.append(record)
        self.entries.append(entry)
        for listener in RECORD_LISTENERS:
            listener(self.ctx, record)
        return entry


class CompiledFunction:
    """A Python function whose frames kiln compiles: what `kiln.compile(fn)` returns (as a callable)."""

    def __init__(self, fn: types.FunctionType, ctx: CompileContext):
        self.fn, self.ctx = fn, ctx
        self.frame = ctx.frame(FrameSpec(fn.__code__))
        code = fn.__code__
        star_args = code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        self._simple = not star_args and code.co_kwonlyargcount == 0
        self._names = code.co_varnames[:code.co_argcount]
        # a call with exactly this many positional arguments (and no keywords) binds by zip
        self._num_positional = len(self._names) if self._simple else -1
        # follow_wrapped=False: a functools.wraps'd wrapper binds by its own (*args, **kwargs), not the wrapped
        # signature
        self._signature = inspect.signature(fn, follow_wrapped=False) if not self._simple or fn.__defaults__ else None
        self._globals, self._closure = fn.__globals__, fn.__closure__ or ()  # both read-only attributes
        self._run_frame = self.frame.__call__  # a bound method: calls it without the slot lookup per call
        functools.update_wrapper(self, fn)

    def bind(self, args: tuple, kwargs: dict) -> dict:
        if self._simple and not kwargs:
            missing = len(self._names) - len(args)
            defaults = self.fn.__defaults__ or ()  # read per call, as Python's own call does
            if 0 <= missing <= len(defaults):  # `forward(x)` of `forward(x, labels=None)`: by zip, not inspect
                return dict(zip(self._names, args + defaults[len(defaults) - missing:]))
        signature = self._signature or inspect.signature(self.fn, follow_wrapped=False)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            if not hasattr(self.fn, "__signature__"):  # the signature is the code's: Python's own binding fails
                self.fn(*args, **kwargs)  # before running a line, and raises its own message, as eager
            raise
        bound.apply_defaults()
        return dict(bound.arguments)

    def __call__(self, *args, **kwargs):
        if kwargs or len(args) != self._num_positional:
            L = self.bind(args, kwargs)
        else:
            L = dict(zip(self._names, args))
        fn = self.fn
        if config.compiled_autograd and not compiled_autograd.is_enabled():
            with compiled_autograd.enable():  # every backward inside the region: kiln.config.compiled_autograd
                return self._run_frame(L, self._globals, self._closure, lambda: fn(*args, **kwargs))
        return self._run_frame(L, self._globals, self._closure, lambda: fn(*args, **kwargs))


# ------------------------------------------------------------------------------------------
# One capture: interpret, choose the break, write the program, compile the graph
# ------------------------------------------------------------------------------------------

# Breaks kiln resumes after inside a loop all the same: a call of a module whose hooks run natively around
# its compiled forward (FSDP2's sharded blocks in the model's loop over them); stepping the loop natively
# instead would leave the code around the calls uncompiled.
RESUMED_IN_LOOPS = frozenset({"distributed_hooks"})


def capture(spec: FrameSpec, L: dict, G: dict, C: tuple, ctx: CompileContext, opaque: bool,
            auto_dynamic: dict | None = None):
    """The frame captured and compiled (kiln/runtime/collector.py: the cycle collector paused meanwhile)."""
    with collector.paused():
        return _capture_rounds(spec, L, G, C, ctx, opaque, auto_dynamic)


def _capture_rounds(spec: FrameSpec, L: dict, G: dict, C: tuple, ctx: CompileContext, opaque: bool,
                    auto_dynamic: dict | None):
    break_at, reason = None, None
    while True:
        state = CaptureState(L, G, C, break_at, opaque_inputs=opaque, dynamic=ctx.dynamic, auto_dynamic=auto_dynamic,
                             captures_scalars=ctx.fullgraph)
        frame = _root_frame(state, spec, L, C)
        try:
            return _interpret_and_finish(state, spec, ctx, frame, reason)
        except GraphBreak as e:
            if e.reason.id == "autograd_backward" and compiled_autograd.is_active():
                e = backward_boundary(e)
            if _moves_to_an_earlier_raise(e, break_at):
                frame.current, break_at = e.raised_at, None  # met writing the program too, past the break
            if isinstance(e, Unresumable) or break_at is not None:
                _with_guards(e, state)
                raise
            if ctx.fullgraph and not e.reason.boundary:
                raise FullGraphError(f"kiln.compile(fullgraph=True): {e.message()}") from None
            # the code before the raise took `is_compiling()`'s path (LongT5 leaves its mask None): resumed
            # natively, it raises where eager does not. torch.compile skips such a frame and compiles the functions
            # it calls; stepped through natively, the frame's own is_compiling() answers False, as in eager
            on_compiling_path = e.reason.id == "exception" and state.asked_compiling_at is not None and (
                state.asked_compiling_at < frame.current.index)
            compiling_path = "after torch.compiler.is_compiling() chose the path to it"
            if on_compiling_path and opaque:
                raise _with_guards(_unresumable(e, compiling_path), state) from e
            if bytecode.has_try_block(spec.code):
                raise _with_guards(_unresumable(e, "in a function with a try block"), state) from e
            if not resumable_anywhere(spec.code):
                why = "in a function with an instruction a continuation cannot run natively"
                raise _with_guards(_unresumable(e, why), state) from e
            in_loop = (not opaque and not e.reason.boundary and e.reason.id not in RESUMED_IN_LOOPS
                       and bytecode.loops_back_after(spec.code, frame.current.index))
            # A break inside a `with` block resumes in it when the program can hand its manager on (grad mode,
            # autocast; a manager written in Python, whose `__exit__` the continuation calls); one whose manager
            # it cannot rebuild (a generator's, suspended at its `yield`) is unresumable once the program is
            # written, and a continuation that meets one steps through natively (see `CompiledFrame._capture`).
            if on_compiling_path:
                raise _with_guards(StepsNatively(e, compiling_path, for_good=False), state) from e
            if in_loop:
                raise _with_guards(StepsNatively(e, "inside a loop"), state) from e
            break_at, reason = frame.current.index, e
            # a frame stepped through natively breaks at each use of its (opaque) inputs: how it steps, not a
            # break of the user's, whose fallback was recorded once where the frame began to step natively
            if e.reason.boundary or opaque:
                log_breaks.debug("%s: %s", spec.describe(), e.message())
                continue
            log_breaks.info("%s", e.message())
            fallbacks.record_break(e.reason.id, spec.describe(), e.message(), warn_key=spec.function())


def _moves_to_an_earlier_raise(e: GraphBreak, break_at: int | None) -> bool:
    """Whether `e` reads the traceback of an exception raised before the break chosen so far (or before the
    frame's end): that raise is where the frame breaks instead (values/exceptions.py, `TracebackValue`)."""
    return (isinstance(e, TracebackRead) and e.raised_at is not None
            and (break_at is None or e.raised_at.index < break_at))


def _interpret_and_finish(state: CaptureState, spec: FrameSpec, ctx: CompileContext, frame: Frame,
                          reason: GraphBreak | None):
    """Interpret the frame to its return, or to the break chosen last round, and write the output program.

    A function of its own (not the capture loop's body) so that the program's tail closes over this round's
    state and frame only. The global state the interpretation changed is restored before a break propagates.
    """
    try:
        value = frame.run()
        return _finish(state, spec, ctx, frame, None, lambda w: [f"return {w.value(value)}"])
    except StopAtBreak:
        state.exit_autocast_in_graph()
        return _finish(state, spec, ctx, frame, reason, lambda w: _break_tail(w, state, spec, frame, ctx))
    finally:
        state.restore_global_state()


def _with_guards(e: GraphBreak, state: CaptureState) -> GraphBreak:
    """`e`, carrying the guards capture installed before it: what the path to this break depended on.

    Capture decides nothing it does not guard, so inputs passing these guards meet the same break:
    the frame runs eagerly for them (a cache entry), and is compiled again for inputs that fail them.
    """
    if state.graph.is_dynamic():
        _add_shape_guard(state)
    e.guards = state.guards
    return e


def _unresumable(e: GraphBreak, why: str) -> Unresumable:
    """A break the output program cannot resume after (an exception raised natively inside a try
    would skip its handler; an autocast block cannot be rebuilt): the frame runs natively."""
    u = Unresumable(e.reason.id, f"{e.detail} ({why}, so the frame runs natively)")
    u.location, u.callers = e.location, e.callers
    return u


def _root_frame(state: CaptureState, spec: FrameSpec, L: dict, C: tuple) -> Frame:
    code = spec.code
    names = spec.local_names if spec.local_names is not None else tuple(L)
    locals_ = {name: wrap_lazy(state, L[name], LocalSource(name)) for name in names}
    stack = [NULL if is_null else _stack_value(state, L[f"___stack{i}"], LocalSource(f"___stack{i}"))
             for i, is_null in enumerate(spec.stack_nulls)]
    state.inherited_stack = frozenset(map(id, stack))
    state.in_python_block = any(not isinstance(L[f"___stack{at}"], (Reentry, GradModeRestore))
                                for at in bytecode.with_exits(code, spec.start))
    cells = {name: CellValue(real=cell, source=ClosureSource(i, name))
             for i, (name, cell) in enumerate(zip(code.co_freevars, C))}
    for name in spec.cell_names:
        cells[name] = CellValue(real=L[f"___cell_{name}"], source=LocalSource(f"___cell_{name}"))
    return Frame(state, code, state.G, locals_, cells, is_root=True, start=spec.start, stack=stack)


def _stack_value(state: CaptureState, obj, source: LocalSource):
    """A continuation's stack entry. A block the break was inside (`Reentry`, outermost first, as the stack
    holds them) is entered again here, at the continuation's start, guarded to be the same block."""
    if not isinstance(obj, Reentry):
        return wrap_lazy(state, obj, source)
    key = state.guards.constant(obj.key(), "block")
    state.guards.add(Guard(GuardKind.EQUALS_MATCH, source, f"{fast_expr(source)}.key() == {key}", repr(obj),
                           f"{source.expr()}.key()"))
    return obj.enter(state)


def _break_tail(writer, state: CaptureState, spec: FrameSpec, frame: Frame, ctx: CompileContext) -> list[str]:
    """Rebuild the live stack and locals, run the breaking instruction natively, call the continuation."""
    stack = [None if v is NULL else writer.value(v) for v in frame.stack]
    local_exprs = {name: writer.value(v) for name, v in frame.locals.items()}
    # The frame's own cells (not its closure's) pass as real cell objects, the same ones the closures
    # rebuilt for the continuation hold, so a nonlocal write on either side is seen by the other. Empty
    # cells pass too: a variable first assigned after the break may be read by a closure made before it,
    # and a nested function defined after the break may need its own cell (a recursive `def h`).
    own_cells = {name: cell for name, cell in frame.cells.items() if name not in spec.code.co_freevars}
    cell_exprs = {name: writer.value(cell) for name, cell in own_cells.items()}
    writer.namespace["___call_nested"] = functools.partial(call_nested, ctx, ___frame_globals=state.G)
    writer.namespace["___enter_with"] = enter_with
    writer.namespace["___raise_at"] = functools.partial(raise_at, spec.code)
    writer.namespace["___exit_with"] = functools.partial(exit_with, writer.namespace["___call_nested"])
    writer.namespace["___raised_at"] = functools.partial(raised_at, spec.code)
    writer.namespace["___from_users_frame"] = from_users_frame

    def resume(index: int, new_stack: list) -> str:
        target = FrameSpec(spec.code, index, tuple(s is None for s in new_stack), tuple(local_exprs), tuple(cell_exprs),
                           spec.native)
        name = writer.constant(ctx.frame(target))
        items = [f"{k!r}: {v}" for k, v in local_exprs.items()]
        items += [f"'___stack{i}': {s}" for i, s in enumerate(new_stack) if s is not None]
        items += [f"'___cell_{k}': {v}" for k, v in cell_exprs.items()]
        if writer.reentries or (handled and grad_exits):  # called once the blocks are left (`_inside_blocks`),
            return f"___next = ({name}, {{{', '.join(items)}}})"  # or the handler (`within_handler`) is past
        if grad_exits:  # called inside the handler that leaves those blocks (see `_exiting_grad_mode_blocks`)
            return f"return {name}({{{', '.join(items)}}}, G, C)"
        return f"return {writer.constant(Continue)}({name}, {{{', '.join(items)}}})"  # run by the caller's loop

    grad_exits = [expr for v, expr in zip(frame.stack, stack) if _is_grad_mode_exit(v)]
    if calls_frame_reader(frame.current, frame.stack, frame.kw_names):  # `eval(s)`: the frame's locals
        reader = writer.constant(functools.partial(read_in_frame, frame_globals=state.G))
        cells = {name: writer.value(cell) for name, cell in frame.cells.items()}
        stack[-2] = f"{reader}({stack[-2]}, {_dict_expr(local_exprs)}, {_dict_expr(cells)})"
    # the blocks around the instruction see an exception raised there: those it entered natively (a native frame's
    # values are all native), and those of a manager written in Python, whose `__exit__` must get it; what the
    # continuation raises is not the instruction's (its own handlers saw it), so it is called past the handler
    handled = spec.native or _in_block_of_python_manager(frame, spec.code)
    lines = render_instruction(frame.current, stack, frame.kw_names, resume, writer.temp)
    if handled:
        lines = within_handler(spec.code, frame.current, stack, lines, resume)
    if writer.reentries:
        lines = _inside_blocks(writer, lines)
    else:
        if handled and grad_exits:
            lines = [*lines, "return ___next[0](___next[1], G, C)"]
        lines = _exiting_grad_mode_blocks(lines, grad_exits)
    loc = frame.location()
    return [f"# graph break at {loc.filename}:{loc.lineno}: {loc.line_text()}"] + lines


def _in_block_of_python_manager(frame: Frame, code: types.CodeType) -> bool:
    """Whether the breaking instruction is inside a `with` block whose `__exit__` is not one kiln traces into the
    graph (grad mode, autocast, inference mode: their blocks are left by the program's own handlers)."""
    return any(not isinstance(frame.stack[at], ExitValue) for at in bytecode.with_exits(code, frame.current.index))


def _dict_expr(exprs: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in exprs.items()) + "}"


def _is_grad_mode_exit(v) -> bool:
    return isinstance(v, ExitValue) and isinstance(v.ctx, GradModeContext) and v.ctx.entered()


def _exiting_grad_mode_blocks(lines: list[str], exits: list[str]) -> list[str]:
    """`lines` (the breaking instruction, then the continuation), leaving the `with torch.no_grad():` blocks
    open at the break when an exception comes out of them, as eager's `with` does: a continuation has no
    exception handlers of its own, so grad mode would stay as the block set it."""
    if not exits:
        return lines
    handler = [f"    {exit_}(None, None, None)" for exit_ in reversed(exits)]  # the innermost block first
    return ["try:", *("    " + line for line in lines), "except BaseException:", *handler, "    raise"]


def _inside_blocks(writer, lines: list[str]) -> list[str]:
    """The breaking instruction run inside the real managers of the blocks it is in (autocast, inference
    mode, and grad-mode blocks inside those), from the grad mode outside them; the continuation, which
    enters them again itself, is called after they are left."""
    managers = ", ".join(f"{writer.constant(r)}.manager()" for r in writer.reentries)
    return ([f"torch._C._set_grad_enabled({writer.grad_outside_blocks})", f"with {managers}:"]
            + ["    " + line for line in lines] + ["return ___next[0](___next[1], G, C)"])


def _finish(state: CaptureState, spec: FrameSpec, ctx: CompileContext, frame: Frame, reason, tail) -> tuple:
    ctx.graph_counter += 1
    compiled, backend_seconds, graph_id = None, 0.0, next(_record_ids)
    graph_name = f"___graph_{ctx.graph_counter}"
    source, writer = write_program(state, graph_fn_name=graph_name, finish=tail,
                                   rerunnable=not spec.native)
    gm = None
    if state.graph.op_count or writer.outputs:
        if state.grad_enabled != state.entry_grad_enabled:
            state.graph.set_grad_enabled(state.entry_grad_enabled)
        if records_grad_inside(state):
            state.graph.start_with_grad_disabled()
        gm = state.graph.output(writer.outputs)
        gm.meta = {"frame": spec.describe(), "kiln.graph_id": graph_id}
        if reason is not None and reason.location is not None:  # named by errors about the graph at run time
            gm.meta["kiln.ends_at"] = f"{reason.location}: {reason.location.line_text()}"
        if reason is not None and reason.reason.id == "autograd_backward":  # see kiln/autograd/graph_parts.py
            gm.meta["kiln.ends_at_backward"] = True
        if log_graph.isEnabledFor(logging.INFO):  # printing a large graph costs more than a warm start spends on it
            log_graph.info("captured graph for %s\n%s", spec.describe(), gm.print_readable(print_output=False))
        guard_input_aliasing(state)  # before the backend, whose fake runs could touch the inputs' fakes
        example_inputs = [real for _, real in state.graph.inputs]
        backend_start = time.perf_counter()
        try:
            compiled = _call_backend(ctx.backend, gm, example_inputs)
        except fallbacks.KilnStrictError:
            raise
        except Exception as e:
            backend = getattr(ctx.backend, "__name__", ctx.backend)
            notes = "".join(f"\n{note}" for note in getattr(e, "__notes__", ()))  # where a repro was written
            raise BackendCompilerFailed(f"backend {backend!r} failed on the graph "
                                        f"of {spec.describe()}: {type(e).__name__}: {e}{notes}") from e
        writer.namespace[graph_name] = compiled
        backend_seconds = time.perf_counter() - backend_start
    if state.graph.is_dynamic():
        _add_shape_guard(state)
    guard_fn = state.guards.compile()
    namespace = dict(writer.namespace)
    exec(compile(source, f"{PROGRAM_FILE_PREFIX}{spec.code.co_name}>", "exec"), namespace)
    log_guards.info("guards for %s\n%s", spec.describe(), state.guards)
    record = CaptureRecord(spec.describe(), gm, state.graph.op_count, reason, state.guards, source, 0.0,
                           id=graph_id, name=spec.code.co_name, function=spec.function(),
                           backend_seconds=backend_seconds, compiled=compiled)
    if log_program.isEnabledFor(logging.INFO):
        log_program.info("output program for %s\n%s", spec.describe(), record.program_source)
    entry = CacheEntry(guard_fn, namespace["program"], state.guards, source, record,
                       [(source, tuple(real.shape)) for source, real in state.graph.inputs
                        if isinstance(real, torch.Tensor)],
                       state.specialized_scalars, {name: weakref.ref(m) for name, m in state.instances.items()})
    if tensor_checks.available() is None and any(g.native is not None for g in state.guards.guards):
        tensor_checks.when_ready(entry, _recompile_guard)  # its tensor checks move to C++ once that is built
    return entry, record


def _call_backend(backend: Callable, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    if not getattr(backend, "resumes_collection", False):  # a user's backend may run long: collect as usual
        collector.resume()
    for hook in BACKEND_HOOKS:
        backend = hook(backend)
    return backend(gm, example_inputs)


def _recompile_guard(entry: CacheEntry) -> None:
    entry.guard = entry.guards.compile()


_SHAPE_PLACEHOLDER = re.compile(r"L\['t(\d+)'\]")
"""How `produce_guards_expression` names its i-th tensor in a relation."""


def _add_shape_guard(state: CaptureState) -> None:
    """The relations the graph assumed between symbolic sizes (equalities, bounds, divisibility).

    One guard per relation, so that a recompile names the relation that failed. Relations
    over inputs with no dynamic dims (parameters, ...) are left out: their tensor guards
    already check every size and stride; so are those over the bases of view inputs, which
    name no input (see `GraphBuilder.view_bases`): every real view keeps within its base.
    """
    fakes = [node.meta["example_value"] for node in state.graph.graph.nodes if node.op == "placeholder"]
    expr = state.graph.shape_env.produce_guards_expression(fakes + state.graph.view_bases(), ignore_static=False)
    if not expr:
        return
    inputs = state.graph.inputs
    # an input with dynamic dims whose sizes all became constants (duck-sized to a size the graph specialized)
    # is checked by no tensor guard either: its relations stay
    symbolic = {i for i, fake in enumerate(fakes) if state.graph.input_is_dynamic[i] or _has_symbols(fake)}
    for relation in _conjuncts(expr):
        used = sorted({int(i) for i in _SHAPE_PLACEHOLDER.findall(relation)})
        if not set(used) & symbolic or used[-1] >= len(fakes):
            continue
        # one pass: an input's own name may read like a placeholder (a user's local `t1` is L['t1'])
        fast = _SHAPE_PLACEHOLDER.sub(lambda m: fast_expr(inputs[int(m.group(1))][0]), relation)
        readable = _SHAPE_PLACEHOLDER.sub(lambda m: inputs[int(m.group(1))][0].expr(), relation)
        ints = [not isinstance(inputs[i][1], torch.Tensor) for i in used]
        what = "values" if all(ints) else "sizes and values" if any(ints) else "sizes"
        current = f"'{what} ' + repr([" + ", ".join(_input_now(inputs[i]) for i in used) + "])"
        state.guards.add(Guard(GuardKind.SHAPE, None, fast, readable, current))  # no source: one per relation


def _input_now(input_: tuple) -> str:
    """An expression for what a shape relation reads of an input now: a tensor's sizes, an int itself."""
    source, real = input_
    return f"tuple({fast_expr(source)}.shape)" if isinstance(real, torch.Tensor) else fast_expr(source)


def _conjuncts(expr: str) -> list[str]:
    """`a and b and c` -> [a, b, c] (split on the expression's syntax, not its text)."""
    tree = ast.parse(expr, mode="eval").body
    if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And):
        return [ast.get_source_segment(expr, value) for value in tree.values]
    return [expr]


def _has_symbols(t: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset()))


# Entries of one code in all, whatever objects they were compiled for (torch.compile's
# accumulated_cache_size_limit): past it a frame runs eagerly however many instances call it.
ACCUMULATED_LIMIT = 256


def recompile_limit() -> int:
    """`config.cache_size_limit`, or `torch._dynamo.config.cache_size_limit` where only the program set that one."""
    return spellings.recompile_limit(config.cache_size_limit, Config.cache_size_limit)


def call_nested(ctx: CompileContext, fn: Any, *args, ___frame_globals: dict | None = None, **kwargs) -> Any:
    """Call `fn` natively after a graph break, compiling it through kiln when it is Python code with something
    of torch's in its frame (kiln.capture.tensor_frames).

    `___frame_globals` (a name no user keyword takes): the globals of the frame the call is in. `globals()`, and
    `eval(s)` and `exec(s)` without a namespace, read the calling frame's globals, which here are the output
    program's: they get the user's frame's instead."""
    if ___frame_globals is not None and not kwargs:
        if fn is builtins.globals and not args:
            return ___frame_globals
        if any(fn is reader for reader in FRAME_READERS) and len(args) == 1:  # `is`: `in` would run fn's __eq__
            return fn(args[0], ___frame_globals)
    if spellings.is_disabled(fn):
        return fn(*args, **kwargs)
    route = routes.find(fn)
    if route is not None:
        return route.run(ctx, fn, *args, **kwargs)
    if isinstance(fn, types.MethodType) and _compilable(fn.__func__) and holds_torch_values(fn.__func__, args, kwargs,
                                                                                            fn.__self__):
        return ctx.function(fn.__func__)(fn.__self__, *args, **kwargs)
    if isinstance(fn, torch.nn.Module) and _compilable(getattr(type(fn).forward, "__func__", type(fn).forward)):
        return call_module(fn, ctx.function(type(fn).forward), lambda: ctx.function(call_module_with_hooks),
                           args, kwargs)
    if _compilable(fn) and holds_torch_values(fn, args, kwargs):
        return ctx.function(fn)(*args, **kwargs)
    return fn(*args, **kwargs)


# Functions whose call suspends (generators, coroutines, async generators) run natively; only plain ones compile.
_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _compilable(fn: Any) -> bool:
    if not isinstance(fn, types.FunctionType) or spellings.is_disabled(fn):
        return False
    module = fn.__module__ or ""
    return not (fn.__code__.co_flags & _SUSPENDABLE) and not module.startswith(("kiln", "torch."))


def has_hooks(m: torch.nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


_NO_FORWARD = object()


@contextlib.contextmanager
def forward_replaced(module: torch.nn.Module, compiled_forward: Callable):
    """While in the block, calling `module` runs its hooks natively around `compiled_forward(module, ...)`.

    nn.Module's call reads `self.forward`, so an instance attribute stands in for the class's forward; the
    module's own state (parameters, hooks, class) is left as it is.
    """
    previous = module.__dict__.get("forward", _NO_FORWARD)
    module.__dict__["forward"] = functools.partial(compiled_forward, module)
    try:
        yield
    finally:
        if previous is _NO_FORWARD:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = previous


def call_with_compiled_forward(module: torch.nn.Module, compiled_forward: Callable, args: tuple, kwargs: dict) -> Any:
    """`module(*args, **kwargs)` with its hooks run natively around its forward compiled.

    Hooks kiln must not trace (FSDP2's all-gathers and reduce-scatters), and those of a module called
    natively after a graph break, keep their eager semantics this way; the forward between them is compiled.
    """
    with forward_replaced(module, compiled_forward):
        return module(*args, **kwargs)


def call_module(module: torch.nn.Module, compiled_forward: Callable, hooked_call: Callable[[], Callable],
                args: tuple, kwargs: dict) -> Any:
    """`module(*args, **kwargs)` with its forward compiled: alone when it has no hooks; with its forward hooks
    compiled together with it (`hooked_call()`, kiln.capture.hooked_call), as torch.compile inlines them;
    with backward or global hooks, or hooks kiln must not trace (FSDP2's), run natively around it."""
    if not (has_hooks(module) or any_global_hooks()):
        return compiled_forward(module, *args, **kwargs)
    if has_only_forward_hooks(module) and not any_global_hooks() and not hooks_run_natively(module):
        return hooked_call()(module, *args, **kwargs)
    return call_with_compiled_forward(module, compiled_forward, args, kwargs)

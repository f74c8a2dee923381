"""Where the minifier meets the pipeline: the backend call after capture, and the code generator after AOT.

    KILN_REPRO_AFTER=capture|aot     (torch's TORCHDYNAMO_REPRO_AFTER=dynamo|aot is read too)
    KILN_REPRO_LEVEL=0|1|2|3         (TORCHDYNAMO_REPRO_LEVEL): 0 writes nothing (a repro script sets it, so
                                     that running one does not write another), 1 writes the repro of the whole
                                     failing graph,
                                     2 (default) also minifies crashes, 3 also checks every compiled graph
                                     against eager and minifies accuracy failures
    KILN_REPRO_TIMEOUT=seconds       the minifier's time limit (default 600); past it, the smallest failing
                                     graph found so far is written

A backend that raises always gets a repro of its whole graph written (the error names it), switches or not:
a crash should leave something to debug with. Repros go to `<debug dir>/minifier/`.
"""
from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kiln import backends, fallbacks
from kiln.config import OPTIONS, CompileOptions, debug_dir, validate_options
from kiln.debug.minifier import delta, script
from kiln.debug.minifier.check import ACCURACY, CRASH, Checker, Outcome, error_type
from kiln.debug.minifier.graphs import Case, lifted
from kiln.pipeline import compile_aten_graph

AFTER_NAMES = {"capture": "capture", "dynamo": "capture", "aot": "aot"}
_state = threading.local()  # `busy`: the minifier's own compiles run, which the hooks leave alone


class AccuracyError(RuntimeError):
    """KILN_REPRO_LEVEL=3: a compiled graph differs from eager (the message names the repro scripts)."""


@dataclass(frozen=True)
class Settings:
    after: str | None
    level: int
    time_limit: float


def settings() -> Settings:
    """The switches, read at each compile (a test or a script may set them late)."""
    raw = os.environ.get("KILN_REPRO_AFTER") or os.environ.get("TORCHDYNAMO_REPRO_AFTER") or ""
    after = AFTER_NAMES.get(raw.strip().lower()) if raw else None
    if raw and after is None:
        warnings.warn(f"KILN_REPRO_AFTER={raw!r}: expected 'capture' or 'aot' (torch's 'dynamo' means capture); "
                      "ignored", stacklevel=3)
    level = os.environ.get("KILN_REPRO_LEVEL") or os.environ.get("TORCHDYNAMO_REPRO_LEVEL") or "2"
    return Settings(after, int(level), float(os.environ.get("KILN_REPRO_TIMEOUT") or 600))


def after_capture(backend: Callable) -> Callable:
    """kiln.capture.entry.BACKEND_HOOKS: `backend`, with a repro written when it fails on a captured graph."""

    def compile_or_repro(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        s = settings()
        if _busy():
            return backend(gm, example_inputs)
        watched = s.after == "capture"
        reference = _copy(gm) if watched else gm  # a backend may rewrite the graph it is given
        with fallbacks.collected(count=True) as fell:
            try:
                compiled = backend(gm, example_inputs)
            except Exception as e:
                written = getattr(e, "kiln_repro_written", False)  # by the AOT hook, inside kiln's inductor
                policy = isinstance(e, fallbacks.KilnStrictError) and not watched  # KILN_STRICT=1 said it already
                if s.level == 0 or written or policy:
                    raise
                crash = Outcome(CRASH, f"{type(e).__name__}: {e}", error_type(e))
                for note in report(lambda: lifted(reference, list(example_inputs)), Checker("capture", backend),
                                   crash, "capture", _label(gm), s, backend):
                    e.add_note(note)
                raise
        if watched and (fell or s.level >= 3):  # a fallback to ATen inside kiln's inductor is a crash here too
            case = lifted(reference, list(example_inputs))
            checker = Checker("capture", backend)
            with _minifying():
                found = checker.outcome(case)
            if found.kind in (CRASH, ACCURACY):
                notes = report(lambda: case, checker, found, "capture", _label(gm), s, backend)
                if fell and found.kind == CRASH:  # the program runs on, through ATen
                    warnings.warn("\n".join(notes), stacklevel=3)
                    return compiled
                raise AccuracyError("\n".join([f"{_label(gm)}: {found.kind}: {found.detail}", *notes]))
        return compiled

    return compile_or_repro


def after_aot(compile_graph: Callable) -> Callable:
    """kiln.pipeline.ATEN_COMPILER_HOOKS: under KILN_REPRO_AFTER=aot, an ATen graph the code generator fails on
    (raises, falls back to ATen, or, at level 3, computes wrong) gets a repro, minified."""

    def compile_or_repro(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions) -> Callable:
        s = settings()
        if s.after != "aot" or s.level == 0 or _busy():
            return compile_graph(gm, example_inputs, options)
        reference = _copy(gm)
        crash = compiled = None
        with fallbacks.collected(count=True) as fell:
            try:
                compiled = compile_graph(gm, example_inputs, options)
            except Exception as e:
                crash = e
        if crash is None and not fell and s.level < 3:
            return compiled
        inputs = real_inputs(example_inputs)
        if inputs is None:
            return _finish(crash, compiled, ["kiln wrote no repro: the graph's sizes are symbolic, with no example "
                                             "value to build standalone inputs from"])
        checker = Checker("aot", lambda g, i: compile_graph(g, i, options))
        case = Case(reference, inputs)
        with _minifying():
            found = checker.outcome(case)
        if found.kind not in (CRASH, ACCURACY) and crash is None and not fell:
            return compiled  # level 3, and kiln agrees with eager
        if found.kind not in (CRASH, ACCURACY):  # e.g. it fails on the graph's real inputs only
            return _finish(crash, compiled, [f"kiln wrote no repro: the graph does not fail on random inputs of its "
                                             f"metadata ({found.kind} {found.detail})".rstrip()])
        label = f"{_label(gm)}_{gm.meta.get('kiln.aot', {}).get('kind', 'graph')}"
        notes = report(lambda: case, checker, found, "aot", label, s, "inductor", options)
        if crash is None and not fell:
            error = AccuracyError("\n".join([f"{label}: {found.kind}: {found.detail}", *notes]))
            error.kiln_repro_written = True
            raise error
        return _finish(crash, compiled, notes)

    return compile_or_repro


def _finish(crash: Exception | None, compiled: Callable | None, notes: list[str]) -> Callable:
    """Raise the compile's error with the repro's notes, or (it fell back) warn with them and go on."""
    if crash is not None:
        for note in notes:
            crash.add_note(note)
        crash.kiln_repro_written = bool(notes)
        raise crash
    if notes:
        warnings.warn("\n".join(notes), stacklevel=3)
    return compiled


def _busy() -> bool:
    return getattr(_state, "busy", False)


@contextlib.contextmanager
def _minifying():
    """The minifier's own compiles (its checks, its trials) run with the hooks off: a trial that fails must not
    write and minify a repro of its own."""
    before = _busy()
    _state.busy = True
    try:
        yield
    finally:
        _state.busy = before


def report(make_case: Callable[[], Case], checker: Checker, failure: Outcome, after: str, label: str, s: Settings,
           backend, options: CompileOptions | None = None) -> list[str]:
    """Write the whole graph's repro, minify it where the level asks, and return notes naming the scripts. Never
    raises: the user's error matters more than a repro that could not be written."""
    with _minifying():
        try:
            return _report(make_case(), checker, failure, after, label, s, backend, options)
        except Exception as e:  # noqa: BLE001
            return [f"kiln could not write a repro of {label}: {type(e).__name__}: {e}"]


def _report(case: Case, checker: Checker, failure: Outcome, after: str, label: str, s: Settings, backend,
            options: CompileOptions | None) -> list[str]:
    folder = debug_dir() / "minifier"
    whole = _write(case, checker, failure, after, folder / f"{label}_{after}.py", backend, options,
                   f"{label}, the whole graph ({failure.kind}: {failure.detail})")
    notes = [f"kiln repro of the whole graph: {whole} (run it to see the failure; python -m kiln minify {whole} "
             "shrinks it)"]
    wanted = s.after == after and (s.level >= 2 if failure.kind == CRASH else s.level >= 3)
    if not wanted:
        return notes
    progress = _progress(label)
    small, finished = delta.minify(case, checker, failure, s.time_limit, progress)
    how = "minified" if finished else f"partly minified (time limit {s.time_limit:.0f} s)"
    path = _write(small, checker, failure, after, folder / f"{label}_{after}_minified.py", backend, options,
                  f"{label}, {how} to {_nodes(small)} ({failure.kind}: {failure.detail})")
    progress(f"wrote {path}")
    return notes + [f"kiln repro, {how} to {_nodes(small)}: {path}"]


def minify_script(path: str | Path, time_limit: float) -> Path | None:
    """`python -m kiln minify repro.py`: shrink a repro script's graph; the minified script's path, or None if
    the script's graph does not fail."""
    with _minifying():
        return _minify_script(path, time_limit)


def _minify_script(path: str | Path, time_limit: float) -> Path | None:
    repro, _ = script.load(path)
    options = repro.options
    if repro.after == "capture":
        compile_fn = backends.resolve_backend(repro.backend, None, options or None)
    else:
        resolved = validate_options(None, options)
        compile_fn = lambda g, i: compile_aten_graph(g, i, resolved)  # noqa: E731
    checker = Checker(repro.after, compile_fn)
    label = Path(path).stem
    found = checker.outcome(repro.case)
    if found.kind not in (CRASH, ACCURACY):
        _progress(label)(f"the graph does not fail ({found.kind}{': ' + found.detail if found.detail else ''})")
        return None
    small, finished = delta.minify(repro.case, checker, found, time_limit, _progress(label))
    out = Path(path).with_name(f"{label}_minified.py")
    how = "minified" if finished else f"partly minified (time limit {time_limit:.0f} s)"
    repro.case, repro.failure = small, found.kind
    _write_repro(repro, checker, found, out, f"{label}, {how} to {_nodes(small)} ({found.kind}: {found.detail})",
                 *script.backend_reference(repro.backend, _registered()))
    _progress(label)(f"wrote {out}")
    return out


def _write(case: Case, checker: Checker, failure: Outcome, after: str, path: Path, backend,
           options: CompileOptions | None, note: str) -> Path:
    name, chosen = _backend_and_options(backend, options)
    kind = case.gm.meta.get("kiln.aot", {}).get("kind", "inference")
    repro = script.Repro(case, after, failure.kind, name, chosen, kind)
    return _write_repro(repro, checker, failure, path, note, *script.backend_reference(name, _registered()))


def _write_repro(repro: script.Repro, checker: Checker, failure: Outcome, path: Path, note: str,
                 backend_import: str, backend_expr: str) -> Path:
    """Write the script; save the failing values beside it where its random inputs do not fail the same way."""
    saved = path.with_suffix(".pt")
    saved.unlink(missing_ok=True)
    script.write(repro, path, note, backend_import, backend_expr)
    written, _ = script.load(path)  # the script's own graph and random inputs, as running it builds them
    if not checker.fails_like(written.case, failure):
        script.save_inputs(repro, path)
    return path


def _backend_and_options(backend, options: CompileOptions | None) -> tuple:
    """The backend as the script names it and the options that differ from their defaults."""
    if options is None and isinstance(getattr(backend, "options", None), CompileOptions):
        backend, options = backend.name, backend.options  # kiln's inductor bound to its options
    chosen = {k: v for k, v in (options.as_dict() if options is not None else {}).items() if v != OPTIONS[k].default}
    return backend, chosen


def _nodes(case: Case) -> str:
    n = case.size[0]
    return f"{n} node" if n == 1 else f"{n} nodes"


def _registered() -> dict:
    return {name: entry.fn for name, entry in backends._REGISTRY.items()}


def real_inputs(example_inputs: list) -> list | None:
    """Real tensors with the metadata of the (fake) example inputs; integer tensors hold zeros (valid indices)."""
    out = []
    for v in example_inputs:
        if isinstance(v, torch.SymInt):
            v = v.node.hint
            if v is None:
                return None
        if isinstance(v, torch.Tensor):
            sizes = [s.node.hint if isinstance(s, torch.SymInt) else s for s in v.shape]
            strides = [s.node.hint if isinstance(s, torch.SymInt) else s for s in v.stride()]
            if None in sizes or None in strides:
                return None
            v = script.make_tensor(tuple(sizes), tuple(strides), v.dtype, v.device, low=0, high=0)
        out.append(v)
    return out


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    out.meta = dict(getattr(gm, "meta", {}))
    return out


def _label(gm: torch.fx.GraphModule) -> str:
    meta = getattr(gm, "meta", {})
    if "kiln.graph_id" in meta:
        return f"graph{meta['kiln.graph_id']}"
    return meta.get("kiln.aot", {}).get("name") or "graph"


def _progress(label: str) -> Callable[[str], None]:
    def show(message: str) -> None:
        print(f"[kiln minifier] {label}: {message}", file=sys.stderr, flush=True)

    return show

"""Seeing what kiln did: logs, explain(), reports, the debug directory, diagrams, accuracy checks.

Debug may import any stage; no stage imports debug. The stages expose listener
lists and wrapper tables instead, which `install()` fills when kiln is imported:
the debug directory writer (kiln.capture.entry.RECORD_LISTENERS,
kiln.pipeline.GRAPH_LISTENERS, kiln.fallbacks.LISTENERS) and the `check_accuracy` option
(kiln.pipeline.BACKEND_WRAPPERS), and the minifier's hooks (kiln.capture.entry.BACKEND_HOOKS,
kiln.pipeline.ATEN_COMPILER_HOOKS).
"""
from __future__ import annotations

from kiln import fallbacks, pipeline
from kiln.capture import entry
from kiln.debug import accuracy, minifier, trace


def install() -> None:
    if trace.on_record not in entry.RECORD_LISTENERS:
        entry.RECORD_LISTENERS.append(trace.on_record)
    if trace.on_graph not in pipeline.GRAPH_LISTENERS:
        pipeline.GRAPH_LISTENERS.append(trace.on_graph)
    if trace.on_fallback not in fallbacks.LISTENERS:
        fallbacks.LISTENERS.append(trace.on_fallback)
    pipeline.BACKEND_WRAPPERS["check_accuracy"] = accuracy.check_accuracy
    if minifier.after_capture not in entry.BACKEND_HOOKS:
        entry.BACKEND_HOOKS.append(minifier.after_capture)
    if minifier.after_aot not in pipeline.ATEN_COMPILER_HOOKS:
        pipeline.ATEN_COMPILER_HOOKS.append(minifier.after_aot)


def check_accuracy(backend, rtol: float = 1e-3, atol: float = 1e-3):
    """`backend` with every compiled graph checked against eager (see kiln/debug/accuracy.py)."""
    return accuracy.check_accuracy(backend, rtol, atol)


def write_repro(gm, args, path, note: str = ""):
    """Save `gm` with its inputs' shapes as a standalone script (see kiln/debug/accuracy.py)."""
    return accuracy.write_repro(gm, args, path, note)


install()

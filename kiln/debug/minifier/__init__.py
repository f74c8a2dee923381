"""The minifier: a graph kiln fails on, shrunk to the few nodes that still fail, written as a standalone script.

It works at two points of the pipeline (kiln/debug/minifier/hooks.py): after capture, on the FX graph given to
the backend, and after AOT, on an ATen graph given to kiln's code generator; on a crash (the compile or the run
raises, or kiln falls back to ATen) or an accuracy failure (an output differs from eager beyond tolerance).

    graphs.py   the failing graph as a `Case` (graph + input values) and the smaller candidates made from it
    check.py    does a candidate fail the same way? (`Checker`, `Outcome`)
    delta.py    the search: truncate, cut outputs, replace subgraphs by inputs, bypass nodes, shrink inputs
    script.py   the repro script: written, and read back by `python -m kiln minify repro.py`
    hooks.py    the switches (KILN_REPRO_AFTER, KILN_REPRO_LEVEL, KILN_REPRO_TIMEOUT) and where they act
"""
from kiln.debug.minifier.hooks import AccuracyError, after_aot, after_capture, minify_script, settings

__all__ = ["AccuracyError", "after_aot", "after_capture", "minify_script", "settings"]

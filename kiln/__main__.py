"""`python -m kiln run [--report out.html] [script.py args...]`: run a script with torch.compile routed to kiln,
then report. `python -m kiln minify repro.py [--timeout S]`: shrink a repro script kiln wrote (kiln/debug/minifier).

Without a script, runs the bundled example (a small ViT-style training loop, eager vs compiled).
The report (stdout at exit) lists, per compiled region: graphs, graph breaks with reason and
file:line, recompiles with the failing guard, compile time by stage, kernels, and the time
spent in compiled code; `--report out.html` writes it as a self-contained page with the
graphs as code, the generated kernels and graph diagrams.
"""
from __future__ import annotations

import argparse
import runpy
import sys

import torch

import kiln
from kiln.api import _contexts
from kiln.capture import entry
from kiln.debug import minifier, trace
from kiln.debug.html import write_html_report
from kiln.debug.report import text_report
from kiln.examples import vit_train


def _ordered(contexts) -> list:
    """Contexts in the order they first compiled something; those never called last."""
    return sorted(contexts, key=lambda c: min((r.id for r in c.records), default=float("inf")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script with torch.compile routed to kiln.compile")
    run.add_argument("--report", metavar="OUT.html", help="also write the report as a self-contained HTML page")
    run.add_argument("script", nargs="?", help="the script (default: the bundled ViT training example)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    minify = sub.add_parser("minify", help="shrink a repro script kiln wrote to the fewest nodes that still fail")
    minify.add_argument("repro", help="the repro script (<debug dir>/minifier/*.py)")
    minify.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds, keeping "
                        "the smallest failing graph found (default 600)")
    options = parser.parse_args(argv)
    if options.command == "minify":
        return 0 if minifier.minify_script(options.repro, options.timeout) is not None else 1

    original_compile = torch.compile
    torch.compile = kiln.compile  # every torch.compile(...) in the script now builds with kiln
    entry.instrumentation.timing = True  # count the time spent in compiled programs
    kept = []  # the report needs every context, also those the script has dropped by exit
    listener = lambda ctx, record: kept.append(ctx) if ctx not in kept else None  # noqa: E731
    entry.RECORD_LISTENERS.append(listener)
    summary, code = None, 0
    try:
        if options.script is None:
            summary = vit_train.main()
        else:
            sys.argv = [options.script, *options.args]
            try:
                runpy.run_path(options.script, run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        torch.compile = original_compile
        entry.RECORD_LISTENERS.remove(listener)
        entry.instrumentation.timing = False
        contexts = _ordered(set(_contexts) | set(kept))
        trace.flush(contexts)
        print(text_report(contexts, summary=summary))
        if options.report:
            title = f"kiln report: {options.script or 'bundled ViT example'}"
            path = write_html_report(options.report, contexts, title=title, summary=summary)
            print(f"\nHTML report: {path}")
    return code


if __name__ == "__main__":
    sys.exit(main())

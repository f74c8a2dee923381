"""`python -m kiln run [script.py args...]`: run a script with torch.compile routed to kiln, then report.

Without a script, runs the bundled example (a small ViT-style training loop).
"""
from __future__ import annotations

import argparse
import runpy
import sys

import torch

import kiln
from kiln.api import _contexts
from kiln.debug.report import text_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script with torch.compile routed to kiln.compile")
    run.add_argument("script", nargs="?", help="the script (default: the bundled ViT training example)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    options = parser.parse_args(argv)

    torch.compile = kiln.compile  # every torch.compile(...) in the script now builds with kiln
    try:
        if options.script is None:
            from kiln.examples import vit_train

            vit_train.main()
        else:
            sys.argv = [options.script, *options.args]
            runpy.run_path(options.script, run_name="__main__")
    finally:
        print(text_report(sorted(_contexts, key=lambda c: id(c))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

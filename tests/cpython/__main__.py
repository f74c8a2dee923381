"""CPython's tests through kiln and torch.compile (tests/cpython/harness.py).

    python -m tests.cpython                                   # every file of harness.FILES, both compilers
    python -m tests.cpython --files test_sort,test_list --out run.jsonl
    python -m tests.cpython --table run.jsonl                 # the Markdown table of a run
    python -m tests.cpython --table kiln.jsonl torch.jsonl    # runs of one compiler each, side by side
    python -m tests.cpython --files test_dict --show kiln     # the tests kiln does not pass, with why

Each test's outcomes go to the JSON-lines file as they finish (one object per test, with its file).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # harness, and tests/ for `support`

from harness import COMPILERS, FILES, FileResult, TestOutcome, ensure_stdlib_tests, run_file, summarize  # noqa: E402


def _read(paths: list[str]) -> list[FileResult]:
    """The runs in `paths`; one test's rows from runs of different compilers (each in its own process) are one
    outcome, when their plain runs ended alike."""
    files: dict[str, FileResult] = {}
    outcomes: dict[tuple[str, str], TestOutcome] = {}
    for path in paths:
        with open(path) as f:
            for row in map(json.loads, filter(str.strip, f)):
                file = row.pop("file")
                seen = outcomes.get((file, row["test"]))
                if seen is not None and seen.plain == row["plain"]:
                    seen.compiled.update(row["compiled"])
                    seen.notes.update(row["notes"])
                    continue
                outcomes[file, row["test"]] = outcome = TestOutcome(**row)
                files.setdefault(file, FileResult(file)).outcomes.append(outcome)
    return [files[f] for f in FILES if f in files] + [r for f, r in files.items() if f not in FILES]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("--compilers", default=",".join(COMPILERS))
    parser.add_argument("-k", dest="keyword", default="", help="only tests whose id contains this")
    parser.add_argument("--out", help="JSON-lines file, appended to")
    parser.add_argument("--table", nargs="+", help="print the table of these result files")
    parser.add_argument("--show", help="list the tests this compiler does not pass, with why")
    args = parser.parse_args(argv)
    if args.table:
        results = _read(args.table)
        print(summarize(results, args.compilers.split(",")))
        if args.show:
            for r in results:
                for o in r.outcomes:
                    if not o.passed(args.show):
                        print(f"{o.test}: {o.plain} -> {o.compiled.get(args.show)}: {o.notes.get(args.show, '')}")
        return 0
    ensure_stdlib_tests()
    compilers = args.compilers.split(",")
    results = []
    for file in args.files.split(","):
        def progress(outcome: TestOutcome, file=file):
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"file": file, **outcome.__dict__}) + "\n")
            if args.show and not outcome.passed(args.show):
                print(f"{outcome.test}: {outcome.plain} -> {outcome.compiled.get(args.show)}: "
                      f"{outcome.notes.get(args.show, '')}", flush=True)

        results.append(run_file(file, compilers, (lambda t: args.keyword in t) if args.keyword else None, progress))
        print(summarize(results[-1:], compilers), flush=True)
    print(summarize(results, compilers))
    return 0


if __name__ == "__main__":
    sys.exit(main())

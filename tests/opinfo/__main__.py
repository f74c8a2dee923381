"""Run the OpInfo rows and write their outcomes into outcomes.json (the CI test checks a sample of it).

    python -m tests.opinfo --all                       every row (hours): rewrites the whole table
    python -m tests.opinfo --ops sin,add --targets cpp  some rows: updates those rows of the table
    python -m tests.opinfo --reason 'extern aten.flip'  the table's rows whose reason matches: rerun the rows a
                                                       fix touches, no others (add --ops to narrow it further)
    python -m tests.opinfo --rates                      print the table's pass/fallback/xfail counts
    python -m tests.opinfo --dynamic --every 2 ...      compile with dynamic=True; the rows go to (and --rates,
                                                       --reason read) outcomes_dynamic.json instead

Rows run in worker processes, a chunk at a time, each row's result appended to a JSON-lines journal
as it finishes: a worker that crashes (a segfault in a kernel) costs its row, recorded as an xfail,
and the sweep goes on after it; a sweep run again with the same journal resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the Triton rows run interpreted
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for `support`

from . import table  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.opinfo")
    p.add_argument("--all", action="store_true", help="every row; rewrites the table")
    p.add_argument("--ops", default="", help="comma-separated OpInfo names (with variant)")
    p.add_argument("--dtypes", default="", help="comma-separated dtype names")
    p.add_argument("--every", type=int, default=1, help="only the ops whose name hashes to 0 modulo this")
    p.add_argument("--reason", default="", help="only the table's rows whose reason matches this regex")
    p.add_argument("--targets", default="cpp,triton")
    p.add_argument("--modes", default="fwd,bwd")
    p.add_argument("--max-samples", type=int, default=4, help="samples per row (0: all)")
    p.add_argument("--journal", default="", help="JSON-lines file of finished rows (resumes a sweep)")
    p.add_argument("--chunk", type=int, default=40, help="rows per worker process")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--rates", action="store_true")
    p.add_argument("--dynamic", action="store_true", help="compile with dynamic=True; its own table")
    args = p.parse_args(argv)
    if args.rates:
        print(json.dumps(table.rates(table.load(table.path_for(args.dynamic))["rows"]), indent=1))
        return 0
    if args.worker:
        return _work(args)
    return _sweep(args)


def _selected(args) -> list[str]:
    from .harness import op_db, rows

    ops = op_db()
    if args.ops:
        ops = {k: v for k, v in ops.items() if k in args.ops.split(",")}
    ops = {k: v for k, v in ops.items() if zlib.crc32(k.encode()) % args.every == 0}
    dtypes = set(args.dtypes.split(",")) if args.dtypes else None
    chosen = rows(ops, tuple(args.targets.split(",")), tuple(args.modes.split(",")))
    keys = [r.key for r in chosen if dtypes is None or r.dtype in dtypes]
    if args.reason:  # rows the table holds, failing or falling back for the reason a fix addresses
        tabled, pattern = table.load(table.path_for(args.dynamic))["rows"], re.compile(args.reason)
        keys = [k for k in keys if k in tabled and pattern.search(tabled[k]["reason"])]
    return keys


def _sweep(args) -> int:
    if not (args.all or args.ops or args.dtypes or args.every > 1 or args.reason):
        print("choose rows: --all, --ops, --dtypes, --every or --reason", file=sys.stderr)
        return 2
    keys = _selected(args)
    journal = Path(args.journal or "opinfo_journal.jsonl")
    done = _read_journal(journal)
    todo = [k for k in keys if k not in done]
    print(f"{len(keys)} rows, {len(todo)} to run", flush=True)
    while todo:
        chunk, todo = todo[:args.chunk], todo[args.chunk:]
        _run_chunk(chunk, journal, args)
        done = _read_journal(journal)
        todo = [k for k in chunk if k not in done] + todo  # a crash leaves the chunk's tail to run
    done = _read_journal(journal)
    current = table.load(table.path_for(args.dynamic))
    rows = {} if args.all else current["rows"]
    rows.update({k: done[k] for k in keys if k in done})
    meta = {"max_samples": args.max_samples or None}
    table.save({"meta": {**current.get("meta", {}), **meta}, "rows": rows}, table.path_for(args.dynamic))
    print(json.dumps(table.rates(rows), indent=1))
    return 0


def _run_chunk(chunk: list[str], journal: Path, args) -> None:
    keys_file = journal.with_suffix(".keys")
    keys_file.write_text("\n".join(chunk))
    started = journal.with_suffix(".started")
    started.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "tests.opinfo", "--worker", str(keys_file), "--journal", str(journal),
           "--max-samples", str(args.max_samples)] + (["--dynamic"] if args.dynamic else [])
    rc = subprocess.call(cmd)
    if rc != 0 and started.exists():  # the row that was running when the worker died
        key = started.read_text()
        _append(journal, key, {"outcome": "xfail", "reason": f"crash: the process died (exit {rc})",
                               "lowered": [], "samples": 0})


def _work(args) -> int:
    from .harness import Row, op_db, run_row

    ops = op_db()
    journal = Path(args.journal)
    started = journal.with_suffix(".started")
    for key in Path(args.worker).read_text().split():
        started.write_text(key)
        row = Row.parse(key)
        result = run_row(ops[row.op], row, args.max_samples or None, dynamic=args.dynamic)
        _append(journal, key, result)
        print(f"{key}: {result['outcome']} {result['reason'][:120]}", flush=True)
    started.unlink(missing_ok=True)
    return 0


def _append(journal: Path, key: str, result: dict) -> None:
    with journal.open("a") as f:
        f.write(json.dumps({"key": key, **result}) + "\n")


def _read_journal(journal: Path) -> dict:
    if not journal.exists():
        return {}
    out = {}
    for line in journal.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            out[entry.pop("key")] = entry
    return out


if __name__ == "__main__":
    sys.exit(main())

"""OpInfo conformance in CI: a fixed sample of the outcome table's rows, run again, must keep its outcome.

The table (`outcomes.json`, written by `python -m tests.opinfo`) holds every row's outcome: pass, fallback
or xfail with its reason. A sampled row whose outcome changes fails here both ways: a pass that starts
failing, and a failure or fallback that starts passing (then rerun its rows and commit the table, so it
stays true). The sample is chosen by a hash of each row's key: the same rows on every run. `KILN_OPINFO_SWEEP=1`
(or KILN_FULL_TESTS=1) runs every row of the table (hours on two cores). The dynamic table
(`outcomes_dynamic.json`, `python -m tests.opinfo --dynamic`: the rows compiled with dynamic=True) is sampled
the same way, fewer rows.
"""
from __future__ import annotations

import zlib

import pytest

pytest.importorskip("expecttest")  # OpInfo's module imports it

from opinfo import table  # noqa: E402
from opinfo.harness import Row, op_db, run_row  # noqa: E402
from support.sweeps import full  # noqa: E402

# How many rows of each (target, mode) CI runs: the C++ forward is the broad check; the Triton
# interpreter and the backward cost more per row.
SAMPLE = {("cpp", "fwd"): 60, ("triton", "fwd"): 15, ("cpp", "bwd"): 15, ("triton", "bwd"): 0}
DYNAMIC_SAMPLE = {("cpp", "fwd"): 16, ("triton", "fwd"): 0, ("cpp", "bwd"): 8, ("triton", "bwd"): 0}
ROW_SECONDS = 60  # a row over this fails (the table's rows take a few seconds each)


def sampled_rows(rows: dict, sample: dict = SAMPLE) -> list[str]:
    """The first sample[target, mode] keys of each kind in hash order (every key under KILN_OPINFO_SWEEP)."""
    if full("KILN_OPINFO_SWEEP"):
        return list(rows)
    chosen = []
    for (target, mode), count in sample.items():
        keys = [k for k in rows if k.endswith(f"|{target}|{mode}")]
        chosen += sorted(keys, key=lambda k: zlib.crc32(k.encode()))[:count]
    return chosen


TABLE = table.load()
DYNAMIC_TABLE = table.load(table.DYNAMIC_TABLE)


@pytest.fixture(scope="module")
def ops() -> dict:
    """The op database, imported where the rows run, not where they are collected (seconds of imports): a module
    fixture, so the rows run on one xdist worker (tests/conftest.py), which imports it once."""
    return op_db()


@pytest.mark.allows_fallback("the table records which rows fall back: a fallback is an outcome here, not an error")
@pytest.mark.parametrize("key", sampled_rows(TABLE["rows"]))
def test_row_keeps_its_outcome(ops, key):
    _check_row(ops, key, TABLE, dynamic=False)


@pytest.mark.allows_fallback("the table records which rows fall back: a fallback is an outcome here, not an error")
@pytest.mark.parametrize("key", sampled_rows(DYNAMIC_TABLE["rows"], DYNAMIC_SAMPLE))
def test_dynamic_row_keeps_its_outcome(ops, key):
    _check_row(ops, key, DYNAMIC_TABLE, dynamic=True)


def _check_row(ops: dict, key: str, tabled: dict, dynamic: bool) -> None:
    expected = tabled["rows"][key]
    row = Row.parse(key)
    if row.op not in ops:  # the table is made with torch 2.13; an older op database lacks some ops
        pytest.skip(f"{row.op} is not in this torch's op database")
    got = run_row(ops[row.op], row, expected["samples"] or None, seconds=ROW_SECONDS, dynamic=dynamic)
    flag, name = ("--dynamic ", table.DYNAMIC_TABLE.name) if dynamic else ("", table.TABLE.name)
    assert got["outcome"] == expected["outcome"], (
        f"{key}: now {got['outcome']} ({got['reason']}), the table says {expected['outcome']} ({expected['reason']}); "
        f"rerun `python -m tests.opinfo {flag}--ops {row.op}` and commit {name} if kiln got better")


@pytest.mark.parametrize("tabled", [TABLE, DYNAMIC_TABLE], ids=["static", "dynamic"])
def test_table_has_no_wrong_results(tabled):
    """Wrong results are fixed, not tabled: a row may fail to compile, never return wrong numbers."""
    wrong = sorted(k for k, v in tabled["rows"].items() if v["reason"].startswith("wrong result"))
    assert not wrong, wrong

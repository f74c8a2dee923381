"""The committed outcome table (`outcomes.json`): one line per row, so a diff shows which rows changed."""
from __future__ import annotations

import json
from pathlib import Path

import torch

TABLE = Path(__file__).with_name("outcomes.json")
# the same rows compiled with dynamic=True (symbolic sizes and int arguments), kept apart from the static table
DYNAMIC_TABLE = Path(__file__).with_name("outcomes_dynamic.json")


def path_for(dynamic: bool) -> Path:
    return DYNAMIC_TABLE if dynamic else TABLE


def load(path: Path = TABLE) -> dict:
    """{"meta": {...}, "rows": {key: {"outcome", "reason", "lowered", "samples"}}}; empty when absent."""
    if not path.exists():
        return {"meta": {}, "rows": {}}
    return json.loads(path.read_text())


def save(table: dict, path: Path = TABLE) -> None:
    meta = {**table.get("meta", {}), "torch": torch.__version__.split("+")[0]}
    lines = [f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)}"
             for key, value in sorted(table["rows"].items())]
    path.write_text('{\n"meta": ' + json.dumps(meta, sort_keys=True) + ',\n"rows": {\n' + ",\n".join(lines) + "\n}}\n")


def rates(rows: dict) -> dict:
    """Per target and mode: how many rows pass, fall back, fail; and, of the rows that reached a kiln lowering
    rule and ran correctly, the share that generated every kernel they meant to (the issue's aim: 90%)."""
    out: dict = {}
    for key, value in rows.items():
        _, _, target, mode = key.split("|")
        counts = out.setdefault(f"{target}/{mode}", {"pass": 0, "fallback": 0, "xfail": 0,
                                                     "lowered_pass": 0, "lowered_fallback": 0})
        counts[value["outcome"]] += 1
        if value["lowered"] and value["outcome"] != "xfail":
            counts[f"lowered_{value['outcome']}"] += 1
    for counts in out.values():
        reached = counts["lowered_pass"] + counts["lowered_fallback"]
        counts["lowered_pass_rate"] = round(100 * counts["lowered_pass"] / reached, 1) if reached else None
    return out

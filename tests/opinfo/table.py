"""The committed outcome table (`outcomes.json`): one line per row, so a diff shows which rows changed."""
from __future__ import annotations

import json
from pathlib import Path

import torch

TABLE = Path(__file__).with_name("outcomes.json")


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
    """Per target and mode: how many rows pass, fall back, fail."""
    out: dict = {}
    for key, value in rows.items():
        _, _, target, mode = key.split("|")
        counts = out.setdefault(f"{target}/{mode}", {"pass": 0, "fallback": 0, "xfail": 0})
        counts[value["outcome"]] += 1
    return out

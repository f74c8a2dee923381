"""`KILN_LOGS=graph_breaks,recompiles,guards,graph,bytecode,aot,output_code,perf_hints,ddp`: what gets logged.

Each topic is one Python logger under `kiln.` (`kiln.graph_breaks`, ...); the
stages log to them at INFO. This module turns the environment variable (or a
call to `set_logs`) into a handler on exactly those loggers, so users see
what they asked for and nothing else. `+topic` means DEBUG for that topic.

A script written for torch.compile sets `TORCH_LOGS` instead: its topics are
read too, through `TORCH_TOPICS` (torch's name -> kiln's topics), with torch's
`+name` (DEBUG) and `-name` (off) prefixes. Its components map onto kiln's
stages (`dynamo` -> capture, `aot` -> aot, `inductor` -> the code generator's
loggers). A topic with no kiln counterpart is one warning, not an error: the
script still runs, as it would under torch.compile.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings

from kiln import torch_switches
from kiln.torch_switches import TORCH_TOPICS

TOPICS = {
    "graph_breaks": "each graph break: reason, user file:line, hint",
    "recompiles": "each recompile: which guard failed, expected vs got",
    "guards": "the guards of each compiled entry",
    "graph": "each captured FX graph, as readable code",
    "bytecode": "each output program (guards + generated Python)",
    "aot": "joint, forward and backward ATen graphs and the partition decision",
    "output_code": "generated kernels and the wrapper",
    "perf_hints": "hints about slow paths (fallbacks to ATen, eager frames)",
    "capture": "the capture stage's own messages (failed captures, at DEBUG)",
    "pipeline": "the code generator: kernels and externs per ATen graph, time per stage (DEBUG)",
    "lower": "lowering decisions (ops run as ATen externs, at DEBUG)",
    "fallbacks": "each fallback to ATen or to eager, as it is recorded",
    "ddp": "how each graph captured inside a DDP forward is split at DDP's gradient buckets",
    "compiled_autograd": "each backward graph compiled autograd captures, and why it recaptured",
    "compiled_autograd_verbose": "compiled autograd's cache misses as the engine sees them (new node, changed size)",
}


_handler: logging.Handler | None = None


def set_logs(spec: str | None) -> list[str]:
    """Enable the comma-separated topics in `spec` ("all" for every topic); returns the enabled names."""
    global _handler
    root = logging.getLogger("kiln")
    if _handler is not None:
        root.removeHandler(_handler)
        _handler = None
    for topic in TOPICS:
        logging.getLogger(f"kiln.{topic}").setLevel(logging.NOTSET)
    if not spec:
        return []
    enabled = []
    for raw in (s.strip() for s in spec.split(",")):
        if not raw:
            continue
        level = logging.DEBUG if raw.startswith("+") else logging.INFO
        name = raw.lstrip("+")
        names = list(TOPICS) if name == "all" else [name]
        for n in names:
            if n not in TOPICS:
                raise ValueError(f"KILN_LOGS: unknown topic {n!r}; known topics: {', '.join(TOPICS)}")
            logging.getLogger(f"kiln.{n}").setLevel(level)
            enabled.append(n)
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[kiln.%(topic)s] %(message)s"))
    _handler.addFilter(_TopicFilter(set(enabled)))
    root.addHandler(_handler)
    return enabled


class _TopicFilter(logging.Filter):
    def __init__(self, topics: set[str]):
        super().__init__()
        self.topics = topics

    def filter(self, record: logging.LogRecord) -> bool:
        topic = record.name.split(".", 1)[-1]
        record.topic = topic
        return topic in self.topics or record.levelno >= logging.WARNING


def from_torch_logs(spec: str) -> tuple[str, list[str]]:
    """TORCH_LOGS as a KILN_LOGS spec, and the names kiln has no counterpart for. `-name` turns a name off,
    as in torch: it is left out here."""
    kiln_names, unknown = [], []
    for raw in (s.strip() for s in spec.split(",")):
        if not raw or raw.startswith("-"):
            continue
        plus = "+" if raw.startswith("+") else ""
        name = raw.lstrip("+")
        if name not in TORCH_TOPICS:
            unknown.append(name)
            continue
        kiln_names += [plus + topic for topic in TORCH_TOPICS[name]]
    return ",".join(kiln_names), unknown


def configure_from_environment() -> list[str]:
    """Turn KILN_LOGS and TORCH_LOGS into handlers; the enabled topics."""
    spec = os.environ.get("KILN_LOGS") or ""
    torch_spec = torch_switches.torch_logs()
    if torch_spec:
        translated, unknown = from_torch_logs(torch_spec)
        spec = ",".join(s for s in (spec, translated) if s)
        if unknown:
            warnings.warn(f"TORCH_LOGS: kiln has no log for {', '.join(map(repr, unknown))}; ignored (kiln's "
                          f"topics: {', '.join(TOPICS)}; torch names it reads: {', '.join(TORCH_TOPICS)})",
                          stacklevel=2)
    return set_logs(spec) if spec else []

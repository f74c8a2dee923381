"""`KILN_LOGS=graph_breaks,recompiles,guards,graph,bytecode,aot,output_code,perf_hints`: what gets logged.

Each topic is one Python logger under `kiln.` (`kiln.graph_breaks`, ...); the
stages log to them at INFO. This module turns the environment variable (or a
call to `set_logs`) into a handler on exactly those loggers, so users see
what they asked for and nothing else. `+topic` means DEBUG for that topic.
"""
from __future__ import annotations

import logging
import os
import sys

TOPICS = {
    "graph_breaks": "each graph break: reason, user file:line, hint",
    "recompiles": "each recompile: which guard failed, expected vs got",
    "guards": "the guards of each compiled entry",
    "graph": "each captured FX graph, as readable code",
    "bytecode": "each output program (guards + generated Python)",
    "aot": "joint, forward and backward ATen graphs and the partition decision",
    "output_code": "generated kernels and the wrapper",
    "perf_hints": "hints about slow paths (fallbacks to ATen, eager frames)",
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


def configure_from_environment() -> None:
    spec = os.environ.get("KILN_LOGS")
    if spec:
        set_logs(spec)

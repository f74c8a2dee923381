"""Fallbacks: what kiln meant to generate but could not, counted, said once, and an error under KILN_STRICT=1.

A fallback is a decision kiln makes on the user's behalf that costs the user the compiled code they asked
for. Every site that takes one calls `record(...)`, which

- keeps a `Fallback` (kind, graph, kernel, stage, cause) and counts it by kind (`counts()`, shown by
  `python -m kiln run`'s report and written to the debug directory);
- warns once per graph (a `KilnFallbackWarning`), so a model that falls back in every step says so once;
- raises `KilnStrictError` naming the graph, the kernel and the cause when `KILN_STRICT=1` is set in the
  environment at that moment (read per fallback, so a test or a benchmark can set it for one run).

The kinds (`KINDS`):

| kind        | what runs instead                         | where (stage)                                        |
|-------------|-------------------------------------------|------------------------------------------------------|
| kernel      | that kernel's ops, as ATen externs        | a kernel failed to generate (codegen) or build       |
| graph       | the whole ATen graph, through ATen        | lowering or anything else before kernels (compile)   |
| frame       | the whole Python frame, eagerly           | a failed capture (capture); an unresumable break     |
|             |                                           | (resume)                                             |
| frame_limit | the frame, eagerly from then on           | `config.cache_size_limit` reached (guards)           |
| graph_break | the breaking instruction, natively        | a break torch.compile would not take (capture)       |

Not fallbacks: ops that are externs by design (matmul, convolution, attention, and any op without a
lowering rule or whose rule declines its arguments: the lowering's declared coverage, measured by the
OpInfo table rather than here), a max-autotune candidate that does not compile (others remain), a
reduce-overhead graph whose CUDA-graph recording fails (its generated code still runs, without the
replay; torch.compile skips CUDA graphs there too), and the graph breaks torch.compile also takes (below).

Which graph breaks are fallbacks. torch's analogue of a strict run is `fullgraph=True`, which fails on
every break; kiln's strict run is about kiln's shortfalls, so a break counts when torch.compile (default
settings) would have captured the construct and kiln did not. `BREAKS_BY_DESIGN` lists the reasons of
kiln's break catalogue (kiln/capture/breaks.py) where torch.compile breaks too, each with why; every other
reason (numpy, an unmodelled call, object, opcode or context manager, hooks, deep inlining) is a
shortfall. Breaks by design are still counted (`by_design_breaks`) for the report, without a warning.
A break kiln cannot resume after (inside a `try` or an unmodelled `with`) is a "frame" fallback whatever
its reason: the whole frame runs eagerly, not just the breaking instruction.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("kiln.fallbacks")

KINDS: dict[str, str] = {
    "kernel": "a kernel failed to generate or build; its ops run through ATen",
    "graph": "a graph failed to lower or compile; it runs through ATen",
    "frame": "capturing a frame failed or could not resume after a break; it runs eagerly",
    "frame_limit": "a frame reached config.cache_size_limit; it runs eagerly from then on",
    "graph_break": "a graph break torch.compile would not take",
}

# Break reasons (kiln/capture/breaks.py CATALOGUE ids) where torch.compile, at default settings, breaks
# too: these end a graph by design and are not fallbacks. Each value says why.
BREAKS_BY_DESIGN: dict[str, str] = {
    "print": "a side effect on the terminal; torch.compile breaks on print too",
    "tensor_to_python": ".item()/.tolist() read a value: torch breaks unless capture_scalar_outputs is set",
    "data_dependent_branch": "Python control flow on a tensor's value cannot be in a graph (torch breaks too)",
    "dynamic_output_shape": "nonzero/unique/masked_select: torch breaks unless capture_dynamic_output_shape_ops",
    "autograd_backward": ".backward() inside the region: torch breaks too (without compiled autograd)",
    "explicit": "the user asked for the break (kiln.graph_break, torch._dynamo.graph_break)",
    "disabled": "the user asked for the function to run eagerly (kiln.disable)",
    "exception": "the user's code raises; the exception is the program's behaviour, not a capture gap",
}


class KilnStrictError(RuntimeError):
    """KILN_STRICT=1 and kiln fell back: the message names the graph, the kernel and the cause."""

    def __init__(self, fallback: "Fallback"):
        self.fallback = fallback
        super().__init__(f"KILN_STRICT=1: {fallback.describe()} (unset KILN_STRICT to let kiln fall back)")


class KilnFallbackWarning(UserWarning):
    """kiln fell back (once per graph); see `kiln.fallbacks.counts()`."""


@dataclass(frozen=True)
class Fallback:
    kind: str         # a key of KINDS
    graph: str        # "graph3/backward" for ATen graphs, the function and its file:line for frames
    cause: str        # the exception or reason, one line
    kernel: str = ""  # the kernel, for kind "kernel"
    stage: str = ""   # the stage that failed: lower, codegen, build, capture, ...

    def describe(self) -> str:
        where = f"{self.graph}, kernel {self.kernel}" if self.kernel else self.graph
        stage = f" at {self.stage}" if self.stage else ""
        return f"kiln fell back ({self.kind}{stage}) in {where}: {self.cause}. {KINDS[self.kind]}"


# Observers (the debug directory writer, installed by kiln.debug): listener(fallback) after each record.
LISTENERS: list[Callable[[Fallback], None]] = []

_lock = threading.Lock()
_records: list[Fallback] = []
_warned: set[str] = set()
by_design_breaks: Counter = Counter()  # break reason id -> breaks by design seen


def strict() -> bool:
    """Whether KILN_STRICT is set (to anything but "" or "0") now."""
    return os.environ.get("KILN_STRICT", "0") not in ("", "0")


def record(kind: str, graph: str, cause: str | BaseException, kernel: str = "", stage: str = "") -> Fallback:
    """Count a fallback, warn once for its graph, and raise `KilnStrictError` under KILN_STRICT=1."""
    if isinstance(cause, BaseException):
        cause = describe_exception(cause)
    fallback = Fallback(kind, graph, cause, kernel, stage)
    with _lock:
        _records.append(fallback)
        first = graph not in _warned
        _warned.add(graph)
    log.debug("%s", fallback.describe())
    for listener in LISTENERS:
        listener(fallback)
    if strict():
        raise KilnStrictError(fallback)
    if first:
        warnings.warn(fallback.describe(), KilnFallbackWarning, stacklevel=3)
    return fallback


def record_break(reason_id: str, frame: str, message: str) -> None:
    """A graph break: a fallback unless its reason is in BREAKS_BY_DESIGN."""
    if reason_id in BREAKS_BY_DESIGN:
        with _lock:
            by_design_breaks[reason_id] += 1
        return
    record("graph_break", frame, message, stage="capture")


class KernelBuildFailed(Exception):
    """A target could not generate or build one kernel (raised by codegen/cpp and codegen/triton).

    `nodes`: the FX nodes whose computation the kernel holds, filled in by the pipeline, which knows the
    lowered graph; `with_kernel_fallbacks` runs them through ATen and builds the graph again."""

    def __init__(self, kernel: str, stage: str, cause: BaseException):
        self.kernel, self.stage, self.cause = kernel, stage, cause
        self.nodes: frozenset = frozenset()
        super().__init__(f"kernel {kernel} failed at {stage}: {describe_exception(cause)}")


@contextlib.contextmanager
def kernel_origins(sched, graph):
    """Name, on a `KernelBuildFailed` raised inside, the FX nodes its kernel computes: the origins
    (`LoweredGraph.origins`) of the buffers of its fusion group in `sched`."""
    try:
        yield
    except KernelBuildFailed as e:
        group = next((g for g in sched.kernels() if g.name == e.kernel), None)
        if group is not None:
            e.nodes = frozenset().union(*(graph.origins.get(n.name, frozenset()) for n in group.nodes))
        raise


def with_kernel_fallbacks(graph: str, attempt: Callable[[frozenset], object]):
    """`attempt(through_aten)` (lower, schedule, generate and build a graph with the FX nodes named in
    `through_aten` run as ATen externs), again after each kernel that fails to build, with that kernel's
    nodes added: the rest of the graph keeps its generated kernels. Each such kernel is a "kernel"
    fallback. A failure that names no new node (nothing left to take out) is raised: the caller's graph
    fallback takes over."""
    through_aten: frozenset = frozenset()
    while True:
        try:
            return attempt(through_aten)
        except KernelBuildFailed as e:
            record("kernel", graph, e.cause, kernel=e.kernel, stage=e.stage)
            if e.nodes <= through_aten:
                raise RuntimeError(f"{e}; running its ops through ATen did not remove it") from e.cause
            log.info("%s: kernel %s runs through ATen: nodes %s", graph, e.kernel, ", ".join(sorted(e.nodes)))
            through_aten |= e.nodes


def describe_exception(e: BaseException) -> str:
    """`Type: first line of the message` (a compiler's error output can be pages long)."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    more = " ..." if len(text.splitlines()) > 1 else ""
    return f"{type(e).__name__}: {first}{more}"


def records() -> list[Fallback]:
    with _lock:
        return list(_records)


def counts() -> dict[str, int]:
    """Fallbacks so far by kind (kinds with none left out)."""
    return dict(Counter(f.kind for f in records()))


def summary() -> str:
    """One line per kind with its count, then one line per fallback (for reports and the debug directory)."""
    recorded = records()
    if not recorded and not by_design_breaks:
        return "fallbacks: none"
    lines = [f"fallbacks: {len(recorded)}" + "".join(f"  {k} {n}" for k, n in counts().items())]
    lines += [f"  - {f.describe()}" for f in recorded]
    if by_design_breaks:
        lines.append("graph breaks by design (not fallbacks): "
                     + ", ".join(f"{k} {n}" for k, n in sorted(by_design_breaks.items())))
    return "\n".join(lines)


def reset() -> None:
    """Forget the counts and the graphs already warned about (kiln.reset())."""
    with _lock:
        _records.clear()
        _warned.clear()
        by_design_breaks.clear()


__all__ = ["Fallback", "KernelBuildFailed", "with_kernel_fallbacks", "KilnStrictError", "KilnFallbackWarning", "KINDS", "BREAKS_BY_DESIGN", "record",
           "record_break", "counts", "records", "summary", "strict", "reset"]

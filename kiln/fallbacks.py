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
every break; kiln's strict run is about kiln's shortfalls: a break counts when torch.compile (default
settings) captures the construct and kiln does not. `BREAKS` classifies each reason of kiln's break
catalogue (kiln/capture/breaks.py):

| class       | reasons                                                      | under strict          |
|-------------|--------------------------------------------------------------|-----------------------|
| by design   | print, tensor_to_python, data_dependent_branch,              | counted, no error     |
|             | dynamic_output_shape, autograd_backward, autograd_flags,     |                       |
|             | explicit, disabled, exception: torch.compile breaks there too|                       |
| either      | unsupported_call, unsupported_object, unsupported_opcode,    | counted, no error     |
|             | recursion: the reason holds constructs torch also breaks on  |                       |
|             | (an unknown C function, a class statement) beside ones it    |                       |
|             | traces; kiln cannot tell which, so the corpus (tests/corpus) |                       |
|             | compares graph counts with torch.compile's case by case      |                       |
| shortfall   | numpy, hooks, unknown_context: torch.compile traces numpy,   | a fallback: an error  |
|             | module hooks and user context managers                       |                       |

A break kiln cannot resume after (inside a `try` or an unmodelled `with`) runs the frame eagerly; it is a
"frame" fallback (stage resume) where its reason is a shortfall, and counted like its reason otherwise:
the corpus shows torch.compile running those frames (a print inside `try`, a class statement) without
more graphs than kiln.
Breaks that are not fallbacks are still counted by reason (`breaks`) for the report.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("kiln.fallbacks")

KINDS: dict[str, str] = {
    "kernel": "a kernel failed to generate or build; its ops run through ATen",
    "graph": "a graph failed to lower or compile; it runs through ATen",
    "frame": "capturing a frame failed or could not resume after a break; it runs eagerly",
    "frame_limit": "a frame reached config.cache_size_limit; it runs eagerly from then on",
    "graph_break": "a graph break torch.compile would not take",
}

# Each reason of kiln/capture/breaks.py's CATALOGUE: is a break for it a fallback (torch.compile would
# have captured the construct), and why. See the module docstring for the classes.
BREAKS: dict[str, tuple[bool, str]] = {
    "print": (False, "by design: a side effect on the terminal; torch.compile breaks on print too"),
    "tensor_to_python": (False, "by design: .item()/.tolist(); torch breaks unless capture_scalar_outputs"),
    "data_dependent_branch": (False, "by design: Python control flow on a tensor's value; torch breaks too"),
    "dynamic_output_shape": (False, "by design: nonzero/unique; torch breaks unless capture_dynamic_output_shape_ops"),
    "autograd_backward": (False, "by design: .backward() inside the region; torch breaks too"),
    "compiled_autograd": (False, "not a break: .backward() handed to compiled autograd (a boundary)"),
    "optimizer": (False, "not a break: optimizer.step()/zero_grad() handed to kiln.optim (a boundary)"),
    "explicit": (False, "by design: the user asked for the break"),
    "autograd_flags": (False, "by design: requires_grad_/detach_ on a tensor; torch.compile breaks there too"),
    "disabled": (False, "by design: the user asked for the function to run eagerly"),
    "exception": (False, "by design: the user's code raises; that is the program's behaviour"),
    "unsupported_call": (False, "either: unknown C functions break torch too; torch models more builtins"),
    "unsupported_object": (False, "either: opaque objects break torch too; torch models more types"),
    "unsupported_opcode": (False, "either: a class statement breaks torch too; other opcodes it interprets"),
    "recursion": (False, "either: torch inlines deeper, and gives up somewhere too"),
    "distributed_hooks": (False, "by design: FSDP2's hooks run natively; torch.compile skips them too "
                                 "(skip_fsdp_hooks)"),
    "backend_switch": (False, "by design: an op a torch.backends switch changed by the traced code governs runs "
                               "under that switch, as in eager; torch.compile keeps it in the graph, under the "
                               "switch the call found"),
    "numpy": (True, "shortfall: torch.compile traces numpy calls as torch ops"),
    "hooks": (True, "shortfall: torch.compile inlines module hooks"),
    "unknown_context": (True, "shortfall: torch.compile traces user context managers' __enter__/__exit__"),
}


class KilnStrictError(RuntimeError):
    """KILN_STRICT=1 and kiln fell back: the message names the graph, the kernel and the cause."""

    def __init__(self, fallback: Fallback):
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
breaks: Counter = Counter()  # break reason id -> breaks that are not fallbacks, each place counted once
_breaks_seen: set[tuple[str, str, str]] = set()  # (reason, frame, message) of the breaks counted in `breaks`


def strict() -> bool:
    """Whether KILN_STRICT is set (to anything but "" or "0") now."""
    return os.environ.get("KILN_STRICT", "0") not in ("", "0")


def record(kind: str, graph: str, cause: str | BaseException, kernel: str = "", stage: str = "",
           warn_key: str = "") -> Fallback:
    """Count a fallback, warn once for its graph (or `warn_key`: a function, for all its continuations), and
    raise `KilnStrictError` under KILN_STRICT=1."""
    if isinstance(cause, BaseException):
        cause = describe_exception(cause)
    fallback = Fallback(kind, graph, cause, kernel, stage)
    if getattr(_recovering, "depth", 0):
        return fallback
    if _collectors:
        _collectors[-1].append(fallback)
        if not _collectors[-1].count:
            return fallback
    with _lock:
        _records.append(fallback)
        first = (warn_key or graph) not in _warned
        _warned.add(warn_key or graph)
    log.debug("%s", fallback.describe())
    for listener in LISTENERS:
        listener(fallback)
    if strict():
        raise KilnStrictError(fallback)
    if first:
        warnings.warn(fallback.describe(), KilnFallbackWarning, stacklevel=3)
    return fallback


class Collected(list):
    """The fallbacks recorded inside `collected()`; `count`: whether they also count as usual."""

    def __init__(self, count: bool):
        super().__init__()
        self.count = count


_collectors: list[Collected] = []


@contextlib.contextmanager
def collected(count: bool):
    """The fallbacks recorded inside, for a caller that asks "did this compile fall back?" (the minifier).

    `count=False` (the minifier's trial compiles): they are only collected, not counted, warned or raised
    under KILN_STRICT=1, so the report shows the user's program and not the minifier's trials. `count=True`:
    collected and recorded as usual."""
    found = Collected(count)
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.remove(found)


_recovering = threading.local()


@contextlib.contextmanager
def recovering():
    """Fallbacks recorded inside (on this thread) are kiln's own way back to eager's behaviour (a frame stepped
    through again natively after its graph raised, to raise eager's exception): not the user's, so neither
    counted, warned nor raised under KILN_STRICT=1, whatever collects them. Other threads' fallbacks count."""
    depth = getattr(_recovering, "depth", 0)
    _recovering.depth = depth + 1
    try:
        yield
    finally:
        _recovering.depth = depth


def record_break(reason_id: str, frame: str, message: str, resumable: bool = True, warn_key: str = "") -> None:
    """A graph break (or, not `resumable`, a frame run eagerly because of it): a fallback where `BREAKS`
    says torch.compile captures its construct; otherwise counted by reason."""
    if BREAKS.get(reason_id, (True, ""))[0]:
        record("graph_break" if resumable else "frame", frame, message, stage="capture" if resumable else "resume",
               warn_key=warn_key)
        return
    with _lock:  # a recompile captures the same break again: one print is one break
        if (reason_id, frame, message) not in _breaks_seen:
            _breaks_seen.add((reason_id, frame, message))
            breaks[reason_id] += 1


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
    """`Type: first line of the message`, and its first line naming an error when that is another (a
    compiler's output can be pages long, its first line the command)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    error = next((line for line in lines[1:] if "error" in line.lower()), None)
    return f"{type(e).__name__}: {lines[0]}" + (f" ... {error}" if error else " ..." if len(lines) > 1 else "")


def records() -> list[Fallback]:
    with _lock:
        return list(_records)


def counts() -> dict[str, int]:
    """Fallbacks so far by kind (kinds with none left out)."""
    return dict(Counter(f.kind for f in records()))


def summary() -> str:
    """One line per kind with its count, then one line per fallback (for reports and the debug directory)."""
    recorded = records()
    if not recorded and not breaks:
        return "fallbacks: none"
    lines = [f"fallbacks: {len(recorded)}" + "".join(f"  {k} {n}" for k, n in counts().items())]
    for text, n in Counter(f.describe() for f in recorded).items():  # the same fallback again (each call) once
        lines.append(f"  - {text}" + (f"  (x{n})" if n > 1 else ""))
    if breaks:
        lines.append("graph breaks that are not fallbacks: " + ", ".join(f"{k} {n}" for k, n in sorted(breaks.items())))
    return "\n".join(lines)


def reset() -> None:
    """Forget the counts and the graphs already warned about (kiln.reset())."""
    with _lock:
        _records.clear()
        _warned.clear()
        breaks.clear()
        _breaks_seen.clear()


__all__ = ["Fallback", "KernelBuildFailed", "with_kernel_fallbacks", "kernel_origins", "KilnStrictError",
           "KilnFallbackWarning", "KINDS", "BREAKS", "record", "collected", "record_break", "counts", "records",
           "summary", "strict", "reset"]

"""The catalogue of graph breaks: why kiln ended a graph, explained, with a hint.

Every break the interpreter raises names a `BreakReason` from `CATALOGUE`, so
`explain()`, the logs and `fullgraph=True` errors all speak the same words.
`GraphBreak` is raised where the interpreter meets something it cannot put in
a graph; `Unresumable` where it cannot even continue after running it natively
(the frame then runs eagerly).
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass


@dataclass(frozen=True)
class BreakReason:
    id: str
    explanation: str
    hint: str
    # A boundary ends the graph and resumes in a new one like a break, by design and without losing
    # anything to eager execution: it is allowed under fullgraph=True and not counted as a break.
    boundary: bool = False


CATALOGUE: dict[str, BreakReason] = {
    r.id: r
    for r in [
        BreakReason("print", "print() writes to the terminal, a side effect a graph cannot hold",
                    "remove the print or move it out of the compiled function"),
        BreakReason("tensor_to_python", "a tensor's value is read into Python (.item(), .tolist(), int(t), ...)",
                    "keep the value as a tensor, or move the read out of the compiled region"),
        BreakReason("data_dependent_branch", "a Python branch depends on a tensor's value (if t:, assert t, while t)",
                    "use torch.where / torch.cond, or move the check outside the compiled function"),
        BreakReason("numpy", "a numpy call: kiln does not trace numpy",
                    "use the torch equivalent (torch.arange for np.arange, ...)"),
        BreakReason("unsupported_call",
                    "a call to a function kiln cannot trace (a C function or builtin it does not model)",
                    "replace it with torch operations, or wrap it with kiln.disable if it must run eagerly"),
        BreakReason("autograd_backward",
                    "Tensor.backward() runs the autograd engine; kiln captures it only through compiled autograd",
                    "turn on kiln.config.compiled_autograd (or kiln.compiled_autograd.enable) to capture it, "
                    "or call backward outside the compiled function"),
        BreakReason("compiled_autograd", "the backward runs through compiled autograd, which captures and "
                    "compiles it as its own graph: the forward graph ends before it and the code after it "
                    "continues in a new graph", "nothing to do: this is not a graph break", boundary=True),
        BreakReason("optimizer", "optimizer.step() is compiled by kiln's optimizer compiler as its own graph "
                    "(kiln.optim), and optimizer.zero_grad() only resets .grad: the graph ends before the call "
                    "and the code after it continues in a new graph", "nothing to do: this is not a graph break",
                    boundary=True),
        BreakReason("autograd_flags", "an in-place change of a tensor's autograd flags (requires_grad_, detach_), "
                    "which no compiled graph can make", "set requires_grad before the compiled call, or use "
                    "t.detach() (a new tensor) instead of t.detach_()"),
        BreakReason("explicit", "kiln.graph_break() was called", "remove the kiln.graph_break() call"),
        BreakReason("disabled", "the function is marked kiln.disable, so it runs eagerly",
                    "remove kiln.disable if the function should be compiled"),
        BreakReason("unsupported_object", "an operation on a Python object kiln does not model",
                    "use plain Python containers, tensors and nn.Modules inside the compiled region"),
        BreakReason("unsupported_opcode", "a bytecode instruction kiln does not interpret",
                    "move that construct (generators, try/except around a break, ...) out of the compiled region"),
        BreakReason("dynamic_output_shape",
                    "an op whose output shape depends on tensor values (nonzero, unique, masked_select)",
                    "use a fixed-shape formulation (torch.where with a mask)"),
        BreakReason("exception", "the traced code raises an exception", "check the inputs; the frame runs eagerly"),
        BreakReason("unknown_context", "a `with` block whose context manager kiln does not model",
                    "use torch.no_grad/enable_grad/autocast, or move the block out of the compiled region"),
        BreakReason("backend_switch", "an op on a device whose torch.backends switch (cudnn.enabled, ...) the "
                    "traced code changed: a graph runs under the switches as the call found them, so the op runs "
                    "natively, under the switch as eager runs it", "change the switch outside the compiled region"),
        BreakReason("hooks", "a module with hooks registered is called",
                    "remove the hooks or compile a hook-free module"),
        BreakReason("distributed_hooks", "a module sharded by fully_shard (FSDP2) is called: its hooks all-gather "
                    "parameters and reduce-scatter gradients", "nothing to do: the hooks run natively around the "
                    "module's compiled forward (kiln.compile each block, as torchtitan does, to avoid the break)"),
        BreakReason("recursion", "inlining is nested too deep (recursion)", "rewrite the recursion as a loop"),
    ]
}


@dataclass(frozen=True)
class UserLocation:
    filename: str
    lineno: int
    function: str

    def line_text(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}"


class GraphBreak(Exception):
    """The interpreter cannot put the current instruction in a graph; run it natively and resume."""

    def __init__(self, reason_id: str, detail: str, location: UserLocation | None = None):
        self.reason = CATALOGUE[reason_id]
        self.detail = detail
        self.location = location
        self.callers: list[UserLocation] = []  # the inlining frames around `location`, innermost first
        super().__init__(self.message())

    def add_frame(self, location: UserLocation) -> None:
        """Record one more frame the break propagates through, so the user's own line is named too."""
        if self.location is None:
            self.location = location
        else:
            self.callers.append(location)

    def message(self) -> str:
        where = ""
        if self.location is not None:
            where = f"\n  at {self.location}\n    {self.location.line_text()}"
        for caller in self.callers:
            where += f"\n  called from {caller}\n    {caller.line_text()}"
        return (f"graph break ({self.reason.id}): {self.detail}. {self.reason.explanation}.{where}\n"
                f"  hint: {self.reason.hint}")


def backward_boundary(e: GraphBreak) -> GraphBreak:
    """The `autograd_backward` break `e`, as the boundary it is when compiled autograd is on."""
    boundary = GraphBreak("compiled_autograd", e.detail, e.location)
    boundary.callers = e.callers
    return boundary


class Unresumable(GraphBreak):
    """A break kiln cannot resume after; the frame runs natively (eagerly)."""


# What torch's errors for a tensor made in inference mode and used outside it say (an in-place write, a view
# written, saving for backward, requires_grad_, a version-counter read): each names inference mode or tensors.
_INFERENCE_RULE_WORDS = ("inference tensor", "inferencemode", "inference mode")


def breaks_inference_rule(error: RuntimeError) -> bool:
    message = str(error).lower()
    return any(words in message for words in _INFERENCE_RULE_WORDS)


def inference_tensor_misuse(what: str, error: RuntimeError) -> Unresumable:
    """Eager raises `error` at `what` because a tensor an inference-mode block made is used outside it.

    In the graph that block's ops run as a `no_grad` block, so its tensors are ordinary ones: the op run natively
    after a break would succeed. Only the frame run natively makes real inference tensors, and so eager's error.
    """
    return Unresumable("exception", f"{what} raised {type(error).__name__}: {error} (a tensor made in an "
                       "inference-mode block, used outside it, so the frame runs natively)")


class StepsNatively(GraphBreak):
    """A graph break after which the frame is stepped through natively, its calls compiled, as torch.compile
    skips such a frame and compiles the functions it calls (see `entry.capture`): one inside a loop (a graph
    per iteration otherwise; `for_good`: later calls too), or an exception on the path
    `torch.compiler.is_compiling()` chose (for the inputs that take that path: its guards)."""

    def __init__(self, e: GraphBreak, why: str, for_good: bool = True):
        super().__init__(e.reason.id, f"{e.detail} ({why}, so the frame runs natively and compiles the "
                         "functions it calls)")
        self.location, self.callers = e.location, e.callers
        self.for_good = for_good

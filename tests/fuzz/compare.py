"""The differential comparison: run a program eagerly and through kiln.compile, and classify the difference.

`run_program(source, backend)` executes the program's source twice (two namespaces, so Python state is
not shared), calls the eager `f` and the compiled `f` with equal inputs for each of its CALLS calls, and
compares, call by call: the exception raised (same type), the outputs (structure, dtype, shape,
requires_grad, values within a tolerance, NaN equal to NaN), which outputs *are* inputs or each other,
which outputs share storage with each other or with inputs, the inputs after the call (in-place ops),
the Python state the program writes, and the gradients of the inputs after a backward over the outputs
(an input the loss does not reach must keep `.grad is None`; a backward that raises must raise in both, and
then the program is compared no further: see `BothRaisedInBackward`). A program with a module (MODEL) has its
parameters, buffers and `.grad` in that state, compared again after the backward (hooks ran) and after the
program's `after_call(call)` (an optimizer step), so the next call runs on parameters the step changed.

Outcomes: "ok"; "ill-conditioned" (tensor values, of outputs, gradients, inputs written in place or Python state,
differ only where eager's own value depends on its kernels: eager re-run on the same values laid out
differently, or without vector kernels, disagrees with itself there, see conditioning.py; not a kiln
failure); "wrong" (a value, state, identity or gradient differs, or eager raised and kiln did not); "crash"
(kiln raised what eager did not, or capture failed and kiln fell back to eager); "died" (the process running
it ended: only seen by the subprocess runner in __main__.py).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.utils._pytree import tree_map

import kiln
from tests.fuzz import runtime
from tests.fuzz.targets import compile_options, tensor_device

# values within atol * max(1, |largest expected value|) + rtol * |expected| compare equal
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-7, 1e-7), torch.bfloat16: (5e-2, 5e-2),
             torch.float16: (1e-2, 1e-2)}
PY_FLOAT_TOLERANCE = 1e-4
PASSING = ("ok", "ill-conditioned")


@dataclass
class Outcome:
    status: str                 # ok | ill-conditioned | wrong | crash | died
    kind: str = ""              # what differed, for grouping failures: values, grad, state, raise:NameError...
    message: str = ""           # one line saying where and how
    fallback: str = ""          # the first graph or kernel kiln ran through ATen instead (values may still be right)

    def first_line(self) -> str:
        return f"{self.status} [{self.kind}] {self.message}".split("\n")[0][:300]

    def to_dict(self) -> dict:
        return asdict(self)


class Mismatch(Exception):
    def __init__(self, status: str, kind: str, message: str, numeric: bool = False):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message
        self.numeric = numeric  # tensors of one structure, dtype and shape whose values differ


def wrong(kind: str, message: str) -> Mismatch:
    return Mismatch("wrong", kind, message)


class BothRaisedInBackward(Exception):
    """The backward over the outputs raised the same exception type in eager and kiln. The gradients and hook
    effects it left are partial, in the order the engine ran its nodes (one node per compiled graph, one per op
    in eager), and so is every later state an optimizer step builds from them: the program is compared no
    further."""


# -- value comparison ------------------------------------------------------------------------------
def same_tensor(expected: torch.Tensor, actual, path: str, kind: str) -> None:
    if not isinstance(actual, torch.Tensor):
        raise wrong(kind, f"{path}: expected a tensor, got {type(actual).__name__}")
    for what in ("dtype", "shape", "requires_grad"):
        if getattr(expected, what) != getattr(actual, what):
            raise wrong(kind if what != "requires_grad" else "requires_grad",
                        f"{path}: {what} {getattr(actual, what)} != eager {getattr(expected, what)}")
    if expected.device.type != actual.device.type:
        raise wrong(kind, f"{path}: device {actual.device} != eager {expected.device}")
    close = close_mask(expected, actual)
    if not close.all():
        bad = (~close).nonzero()[0].tolist()
        e, a = expected.detach().cpu(), actual.detach().cpu()
        raise Mismatch("wrong", kind, f"{path}: values differ at {bad}: {a[tuple(bad)].item()} != eager "
                                      f"{e[tuple(bad)].item()}", numeric=True)


def close_mask(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Where `actual` equals `expected` (same shape): exactly for integers and bools, within the dtype's
    tolerance for floats (NaN equal to NaN, an infinity only to itself)."""
    e, a = expected.detach().cpu(), actual.detach().cpu()
    if not e.dtype.is_floating_point:
        return e == a
    e64, a64 = e.double(), a.double()
    atol, rtol = TOLERANCE[e.dtype]
    finite = torch.isfinite(e64)
    scale = max(1.0, e64[finite].abs().max().item()) if finite.any() else 1.0
    # only a finite expected value has a tolerance: `rtol * inf` would let any value equal an infinity
    close = finite & ((e64 - a64).abs() <= atol * scale + rtol * e64.abs())
    return close | (e64 == a64) | (torch.isnan(e64) & torch.isnan(a64))


def same_value(expected, actual, path: str, kind: str = "values") -> None:
    """Structural equality: containers item by item, tensors by same_tensor, floats within a tolerance."""
    if isinstance(expected, torch.Tensor):
        return same_tensor(expected, actual, path, kind)
    if type(expected) is not type(actual):
        raise wrong(kind, f"{path}: type {type(actual).__name__} != eager {type(expected).__name__} ({actual!r:.80})")
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(actual):
            raise wrong(kind, f"{path}: length {len(actual)} != eager {len(expected)}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            same_value(e, a, f"{path}[{i}]", kind)
    elif isinstance(expected, dict):
        if list(expected) != list(actual):
            raise wrong(kind, f"{path}: keys {list(actual)} != eager {list(expected)}")
        for k in expected:
            same_value(expected[k], actual[k], f"{path}[{k!r}]", kind)
    elif isinstance(expected, float):
        if not (math.isclose(expected, actual, rel_tol=PY_FLOAT_TOLERANCE, abs_tol=PY_FLOAT_TOLERANCE)
                or (math.isnan(expected) and math.isnan(actual))):
            raise wrong(kind, f"{path}: {actual!r} != eager {expected!r}")
    elif expected != actual:
        raise wrong(kind, f"{path}: {actual!r:.100} != eager {expected!r:.100}")


# -- identity and aliasing ---------------------------------------------------------------------------
def leaves(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in leaves(v)]
    return []


def identities(outputs: list[torch.Tensor], args: list) -> list:
    """For each output tensor: which input it is, or which earlier output it is, or None."""
    found = []
    for j, out in enumerate(outputs):
        same_input = [i for i, a in enumerate(args) if a is out]
        same_output = [k for k in range(j) if outputs[k] is out]
        found.append(("input", same_input[0]) if same_input else ("output", same_output[0]) if same_output else None)
    return found


def storage_of(t: torch.Tensor):
    storage = t.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


def sharing(outputs: list[torch.Tensor], args: list) -> set:
    """Pairs (output j, output k or input i) whose storages are one: views of each other, in eager and kiln alike."""
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    pairs = set()
    for j, out in enumerate(outputs):
        s = storage_of(out)
        if s is None:
            continue
        pairs |= {("output", j, "output", k) for k in range(j) if storage_of(outputs[k]) == s}
        pairs |= {("output", j, "input", i) for i, a in enumerate(inputs) if storage_of(a) == s}
    return pairs


# -- one call ------------------------------------------------------------------------------------------
def call_once(ns: dict, fn, call: int):
    """(args, result, exception) of one call, made the way the program's header asks."""
    if "before_call" in ns:
        ns["before_call"](call)
    args = ns["inputs"](call)
    if ns.get("RNG"):  # the program draws random numbers: each side draws from the same generator state
        torch.manual_seed(call)
    mode = torch.no_grad() if ns.get("NO_GRAD") else contextlib.nullcontext()
    with mode:
        try:
            return args, fn(*args), None
        except Exception as e:  # noqa: BLE001 - the exception is what is compared
            return args, None, e


def gradients(result, args, call: int) -> tuple[list, Exception | None]:
    """Backward over a weighted sum of the float outputs that require grad; the .grad of each leaf input.

    On odd calls the loss leaves the last such output out: inputs that reach only it must keep `.grad is None`.
    """
    outs = [o for o in leaves(result) if o.requires_grad and o.dtype.is_floating_point]
    if call % 2 and len(outs) > 1:
        outs = outs[:-1]
    if not outs:
        return [], None
    error = None
    try:
        loss = sum((o.float() * torch.arange(o.numel(), device=o.device).reshape(o.shape).cos()).sum() for o in outs)
        loss.backward()
    except Exception as e:  # noqa: BLE001
        error = e
    return [a.grad if isinstance(a, torch.Tensor) and a.is_leaf else None for a in args], error


def first_line(e: BaseException) -> str:
    text = str(e).strip().split("\n")[0]
    return f"{type(e).__name__}: {text[:200]}"


def error_kind(e: BaseException) -> str:
    """The exception's type, and for a wrapper (BackendCompilerFailed) the type of what it wraps."""
    cause = e.__cause__
    return f"{type(e).__name__}({type(cause).__name__})" if cause is not None else type(e).__name__


def compare_outputs(e_res, k_res, e_args, k_args, eager_reruns: Callable[[], dict]) -> str | None:
    """Values, then which outputs are inputs or each other, then which share storage.

    Values that differ only where eager disagrees with itself (`conditioning`) are no mismatch: the
    reason is returned (the program is ill-conditioned there), and the other checks still run.
    """
    ill_conditioned = judged(e_res, k_res, "out", "values", eager_reruns)
    compare_identities(e_res, k_res, e_args, k_args)
    return ill_conditioned


def judged(expected, actual, path: str, kind: str, eager_reruns: Callable[[], dict]) -> str | None:
    """`same_value`, where tensor values that differ only where eager's own do under `conditioning`'s re-runs
    (`eager_reruns()`: variant name -> eager's value of the same thing) are no mismatch: why, or None. Everything
    else (structure, dtypes, shapes, Python values) must still be equal."""
    from tests.fuzz.conditioning import unstable_positions

    try:
        same_value(expected, actual, path, kind)
    except Mismatch as m:
        why = unstable_positions(expected, actual, eager_reruns()) if m.numeric else None
        if why is None:
            raise
        same_value(_tensors_described(expected), _tensors_described(actual), path, kind)
        return f"{m.message}, where eager's own value depends on its kernels: {why}"
    return None


def _tensors_described(value):
    """`value` with each tensor replaced by what `same_tensor` checks besides its values."""
    return tree_map(lambda v: ("tensor", v.dtype, tuple(v.shape), v.requires_grad, v.device.type)
                    if isinstance(v, torch.Tensor) else v, value)


def compare_identities(e_res, k_res, e_args, k_args) -> None:
    e_out, k_out = leaves(e_res), leaves(k_res)
    e_ids, k_ids = identities(e_out, e_args), identities(k_out, k_args)
    if e_ids != k_ids:
        raise wrong("identity", f"output identity {k_ids} != eager {e_ids}")
    e_shared, k_shared = sharing(e_out, e_args), sharing(k_out, k_args)
    if e_shared != k_shared:
        raise wrong("aliasing", f"shared storage {sorted(k_shared)} != eager {sorted(e_shared)}")


def compare_gradients(e_res, k_res, e_args, k_args, call: int, eager_reruns: Callable[[], dict]) -> str | None:
    """The inputs' `.grad` after a backward over the outputs; like values, gradients that differ only where
    eager's own do under `conditioning`'s re-runs are no mismatch (the reason is returned)."""
    from tests.fuzz.conditioning import unstable_positions

    e_grads, e_bwd = gradients(e_res, e_args, call)
    k_grads, k_bwd = gradients(k_res, k_args, call)
    if (e_bwd is None) != (k_bwd is None) or (e_bwd is not None and type(e_bwd) is not type(k_bwd)):
        raise wrong("backward_raise", f"backward: kiln {first_line(k_bwd) if k_bwd else 'ran'}, "
                                      f"eager {first_line(e_bwd) if e_bwd else 'ran'}")
    if e_bwd is not None:
        raise BothRaisedInBackward(first_line(e_bwd))
    ill_conditioned, reruns = [], None
    for i, (e, k) in enumerate(zip(e_grads, k_grads)):
        if (e is None) != (k is None):
            raise wrong("grad_none", f"input {i}: .grad is {'None' if k is None else 'a tensor'}, eager "
                                     f"{'None' if e is None else 'a tensor'}")
        if e is None:
            continue
        try:
            same_tensor(e, k, f"input {i} .grad", "grad")
        except Mismatch as m:
            reruns = reruns if reruns is not None or not m.numeric else eager_reruns()
            why = unstable_positions(e, k, {name: grads[i] if grads is not None and i < len(grads) else None
                                            for name, grads in reruns.items()}) if m.numeric else None
            if why is None:
                raise
            ill_conditioned.append(f"{m.message}, where eager's own gradient depends on its kernels: {why}")
    return "; ".join(ill_conditioned) or None


def compare_call(call: int, eager_ns: dict, kiln_ns: dict, compiled, source: str) -> str | None:
    """One call of the program, eager and compiled: raises Mismatch at the first difference; returns why
    the call is ill-conditioned (values that differ where eager's own do, see `conditioning`), or None."""
    e_args, e_res, e_err = call_once(eager_ns, eager_ns["f"], call)
    e_generator = torch.get_rng_state()
    k_args, k_res, k_err = call_once(kiln_ns, compiled, call)
    # what each side raised first: a call kiln failed (a backend that could not compile it, a strict-mode
    # fallback) stopped before its draws, and is a crash, not a generator moved otherwise
    if e_err is not None and k_err is None:
        raise wrong("no_raise", f"eager raised {first_line(e_err)}; kiln returned")
    if k_err is not None and (e_err is None or type(e_err) is not type(k_err)):
        said = f" (eager raised {first_line(e_err)})" if e_err is not None else ""
        raise Mismatch("crash", f"raise:{error_kind(k_err)}", f"kiln raised {first_line(k_err)}{said}")
    if eager_ns.get("RNG") and not torch.equal(torch.get_rng_state(), e_generator):
        raise wrong("rng_state", "the global generator is not where eager's call left it (a draw dropped or "
                                 "repeated)")
    ill_conditioned = None
    if e_err is None:
        ill_conditioned = compare_outputs(e_res, k_res, e_args, k_args, lambda: eager_reruns(source, call))
    whys = [ill_conditioned,
            judged(e_args, k_args, "input after the call", "input_mutation", lambda: reruns(source, call, "inputs")),
            judged(runtime.python_state(eager_ns), runtime.python_state(kiln_ns), "python state", "state",
                   lambda: reruns(source, call, "state"))]
    if e_err is None and not eager_ns.get("NO_GRAD"):
        whys.append(compare_gradients(e_res, k_res, e_args, k_args, call, lambda: eager_rerun_gradients(source, call)))
        # hooks run in the backward, and module parameters hold the backward's .grad
        whys.append(judged(runtime.python_state(eager_ns), runtime.python_state(kiln_ns), "python state after backward",
                           "state", lambda: reruns(source, call, "state after backward")))
    if "after_call" in eager_ns:  # an optimizer step between calls: the next call must see the new parameters
        eager_ns["after_call"](call)
        kiln_ns["after_call"](call)
        whys.append(judged(runtime.python_state(eager_ns), runtime.python_state(kiln_ns), "python state after the step",
                           "state", lambda: reruns(source, call, "state after the step")))
    return "; ".join(why for why in whys if why) or None


def reruns(source: str, call: int, what: str) -> dict:
    """Eager's `what` (see `conditioning.RUN_CALLS`) of call `call` in each of `conditioning.VARIANTS`."""
    from tests.fuzz.conditioning import eager_results

    return eager_results(source, call, what)


def eager_reruns(source: str, call: int) -> dict:
    """Eager's results of call `call` with the same input values in each of `conditioning.VARIANTS`."""
    return reruns(source, call, "values")


def eager_rerun_gradients(source: str, call: int) -> dict:
    """The inputs' gradients after eager's call `call` in each of `conditioning.VARIANTS` (None: not made)."""
    return reruns(source, call, "gradients")


# -- the whole program ---------------------------------------------------------------------------------
@contextlib.contextmanager
def capture_failures():
    """Collect the frames kiln ran eagerly (kiln.fallbacks kind "frame": capture failed, or the compiled graph
    raised where eager does not; not an unresumable break): a fallback to eager is a crash. Under KILN_STRICT=1
    the call itself raises instead."""
    failures: list[str] = []
    before = len(kiln.fallbacks.records())
    try:
        yield failures
    finally:
        failures += [f for f in kiln.fallbacks.records()[before:] if f.kind == "frame" and f.stage != "resume"]


def load(source: str) -> dict:
    ns = runtime.fresh_namespace()
    exec(compile(source, "<fuzz program>", "exec"), ns)
    return ns


def run_program(source: str, backend: str = "inductor", device: str = "cpu") -> Outcome:
    """Run `source` eagerly and compiled with `backend`; the first difference found, or ok. The outcome names
    the first graph or kernel that fell back to ATen: no wrong value, but compiled code the user did not get
    (under KILN_STRICT=1 the call raises instead, and the program reads as a crash)."""
    runtime.DEVICE = tensor_device(device)
    kiln.reset()
    outcome = _compare_runs(source, backend, compile_options(device))
    slow = [f for f in kiln.fallbacks.records() if f.kind in ("graph", "kernel")]
    outcome.fallback = slow[0].describe().split("\n")[0][:300] if slow else ""
    return outcome


def _compare_runs(source: str, backend: str, options: dict) -> Outcome:
    eager_ns, kiln_ns = load(source), load(source)
    compiled = kiln.compile(kiln_ns["f"], backend=backend, dynamic=kiln_ns.get("DYNAMIC"), options=options or None)
    ill_conditioned = None
    with capture_failures() as failures:
        for call in range(eager_ns["CALLS"]):
            try:
                why = compare_call(call, eager_ns, kiln_ns, compiled, source)
            except Mismatch as m:
                return Outcome(m.status, m.kind, f"call {call}: {m.message}")
            except BothRaisedInBackward:
                break
            ill_conditioned = ill_conditioned or (why and f"call {call}: {why}")
    if failures:
        kind = "graph_raised" if failures[0].stage == "rerun" else "capture_failed"
        return Outcome("crash", kind, failures[0].describe().split("\n")[0])
    if ill_conditioned:
        return Outcome("ill-conditioned", "values", ill_conditioned)
    return Outcome("ok")


def check_program(source: str, backend: str = "inductor", device: str = "cpu") -> None:
    """Assert that kiln agrees with eager on `source`; the failure message shows the program to replay."""
    outcome = run_program(source, backend, device)
    assert outcome.status in PASSING, f"{outcome.first_line()}\nbackend={backend}\n{source}"

"""The corpus harness: one case is a function (or a module factory) and a sequence of calls, run three ways.

Eager is the truth. Through kiln.compile a case must return the same outputs, leave its inputs (in-place ops),
its Python state (side effects) and its gradients as eager leaves them, raise the exception type eager raises,
and keep eager's object identities and storage sharing (an output that *is* an input, or views one, does so
under kiln too). torch.compile with a counting backend gives the reference graph count: kiln must not capture
more graphs than torch.compile does over the same calls, since each extra graph is a break torch avoids, and
must not fall back to running a frame eagerly because its capture failed.

Cases that fail today carry `bug(...)` (wrong values or state, a crash) or `gap(...)` (more graphs than torch,
or an eager fallback), both strict xfails that flip when kiln is fixed.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch._dynamo

import kiln
from kiln.api import context_of
from support.capture import assert_same, graph_count, tensors_in


def bug(reason: str):
    """Mark a case where kiln's values or state differ from eager's; strict, so a fix flips it."""
    return pytest.mark.xfail(strict=True, reason=reason)


def falls_back(what: str):
    """Mark a case where kiln falls back (kiln/fallbacks.py: `what` names the kind and cause) on purpose: it
    runs with KILN_STRICT=0."""
    return pytest.mark.allows_fallback(what)


def gap(what: str):
    """Mark a case where kiln captures more graphs than torch.compile (a capture gap, values are right)."""
    return pytest.mark.xfail(strict=True, reason=f"capture gap: {what}")


@dataclass
class Call:
    """One call's arguments; a plain tuple in a case's calls means positional arguments only."""
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    setup: Callable[[], None] | None = None  # run before each of the three runs (e.g. to change a global)


def call(*args, **kwargs) -> Call:
    return Call(args, kwargs)


def after(setup: Callable[[], None], *args, **kwargs) -> Call:
    """A call preceded by `setup()`: the way a case changes a global or class attribute between calls."""
    return Call(args, kwargs, setup)


@dataclass
class State:
    """Python state a case mutates: reset before every run, snapshot after it, compared with eager's."""
    reset: Callable[[], None]
    snapshot: Callable[[], Any]


def globals_state(namespace: dict, **initial) -> State:
    """State held in module globals: each run starts from deep copies of `initial`; the same names are read back."""
    def reset():
        for name, value in initial.items():
            namespace[name] = copy.deepcopy(value)

    def snapshot():
        return {name: copy.deepcopy(namespace[name]) for name in initial}

    return State(reset, snapshot)


class GraphCounter:
    """torch.compile backend that counts the graphs handed to it and runs each as is."""

    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


@dataclass
class Outcome:
    """What one run left behind: its result or exception, its arguments after the call, the state afterwards."""
    result: Any
    error: BaseException | None
    args: Any
    state: Any


@dataclass
class Counts:
    kiln: int
    torch: int


def _as_call(c) -> Call:
    return c if isinstance(c, Call) else Call(tuple(c))


def _invoke(target, c: Call, observe: Callable[[], Any]) -> Outcome:
    # deepcopy keeps aliasing among the arguments (f(x, x) stays f(x, x)) and copies user objects too
    args, kwargs = copy.deepcopy(c.args), copy.deepcopy(c.kwargs)
    try:
        result, error = target(*args, **kwargs), None
    except Exception as e:  # compared with eager's exception below
        result, error = None, e
    return Outcome(result, error, (args, kwargs), observe())


def _from_torch(value) -> bool:
    """torch's own objects (torch.Size, SymInt, dtypes) compare as themselves, never by their attributes."""
    return type(value).__module__.split(".")[0] == "torch"


def comparable(value):
    """`value` with user objects replaced by (class name, attributes), so that assert_same compares contents."""
    if isinstance(value, (torch.Tensor, torch.nn.Module, type)) or callable(value) or _from_torch(value):
        return value
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if type(value) is tuple:
        return tuple(comparable(v) for v in value)
    if type(value) is dict:
        return {k: comparable(v) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, tuple):
        return (type(value).__name__, comparable(dict(vars(value))))
    return value


def _identity(out, args) -> list:
    """For each output tensor: the index of the input it *is*, else of the input whose storage it shares."""
    inputs = list(tensors_in(args))
    links = []
    for t in tensors_in(out):
        same = [i for i, a in enumerate(inputs) if a is t]
        shared = [i for i, a in enumerate(inputs) if _shares_storage(a, t)]
        links.append((same[0] if same else None, shared[0] if shared else None))
    return links


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.is_sparse or b.is_sparse:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _output_aliasing(out) -> list:
    """Which pairs of output tensors share storage (a view returned next to its base, say)."""
    outs = list(tensors_in(out))
    return [(i, j) for i in range(len(outs)) for j in range(i + 1, len(outs)) if _shares_storage(outs[i], outs[j])]


def _loss(out):
    parts = [t.sum() for t in tensors_in(out) if t.requires_grad and t.dtype.is_floating_point]
    return sum(parts) if parts else None


def _compare(expected: Outcome, actual: Outcome, atol: float, rtol: float, modules) -> None:
    if expected.error is not None:
        assert actual.error is not None, \
            f"eager raised {type(expected.error).__name__}: {expected.error}; kiln returned"
        assert type(actual.error) is type(expected.error), (
            f"eager raised {type(expected.error).__name__}, kiln raised {type(actual.error).__name__}: {actual.error}")
        return
    if actual.error is not None:
        raise actual.error
    assert_same(comparable(expected.result), comparable(actual.result), atol, rtol)
    assert_same(comparable(expected.args), comparable(actual.args), atol, rtol, path="args after the call")
    assert_same(expected.state, actual.state, atol, rtol, path="state after the call")
    assert _identity(actual.result, actual.args) == _identity(expected.result, expected.args), \
        "outputs are (or view) different inputs than in eager"
    assert _output_aliasing(actual.result) == _output_aliasing(expected.result), \
        "outputs share storage differently than in eager"
    _compare_grads(expected, actual, atol, rtol, modules)


def _compare_grads(expected: Outcome, actual: Outcome, atol: float, rtol: float, modules) -> None:
    e_loss, c_loss = _loss(expected.result), _loss(actual.result)
    assert (e_loss is None) == (c_loss is None), "one of eager/kiln outputs requires grad and the other not"
    if e_loss is None:
        return
    e_loss.backward()
    c_loss.backward()
    for i, (e, c) in enumerate(zip(tensors_in(expected.args), tensors_in(actual.args))):
        if e.is_leaf and e.requires_grad:
            assert_same(e.grad, c.grad, atol, rtol, path=f"grad of input {i}")
    if modules is not None:
        for (name, e), (_, c) in zip(modules[0].named_parameters(), modules[1].named_parameters()):
            assert_same(e.grad, c.grad, atol, rtol, path=f"grad of {name}")


EAGER_FALLBACKS = ("frame", "frame_limit")  # kiln.fallbacks kinds where a frame runs eagerly


def _module_state(mod: torch.nn.Module):
    """Buffers, parameters, training flags and plain Python attributes of every submodule."""
    plain = (int, float, str, bool, list, tuple, dict, type(None))
    attrs = {name: {k: copy.deepcopy(v) for k, v in vars(m).items()
                    if not k.startswith("_") and isinstance(v, plain)} for name, m in mod.named_modules()}
    tensors = {k: v.detach().clone() for k, v in mod.state_dict().items()}
    return {"attrs": attrs, "tensors": tensors}


def _run(make_target, calls, backend, state, modules, atol, rtol, compile_kwargs,
         torch_gives_up: str | None = None) -> Counts:
    eager, kiln_src, torch_src = make_target(), make_target(), make_target()
    kiln.reset()  # as torch's below: calls naming one backend share their captures, and each case counts its own
    compiled = kiln.compile(kiln_src, backend=backend, **compile_kwargs)
    torch._dynamo.reset()
    counter = GraphCounter()
    reference = torch.compile(torch_src, backend=counter, **compile_kwargs)

    def observer(target):
        if modules:
            return lambda: _module_state(target)
        return state.snapshot if state is not None else (lambda: None)

    recorded_before = len(kiln.fallbacks.records())
    for c in map(_as_call, calls):
        outcomes = []
        for target, source in ((eager, eager), (compiled, kiln_src), (reference, torch_src)):
            if state is not None:
                state.reset()
            if modules:
                source.zero_grad(set_to_none=True)
            if c.setup is not None:
                c.setup()
            outcomes.append(_invoke(target, c, observer(source)))
        _compare(outcomes[0], outcomes[1], atol, rtol, (eager, kiln_src) if modules else None)
    # A frame kiln failed to capture runs eagerly: right values, but no graph where torch.compile has one (under
    # KILN_STRICT=1, the suite's default, the call itself raised already)
    fallbacks = [f.describe() for f in kiln.fallbacks.records()[recorded_before:] if f.kind in EAGER_FALLBACKS]
    assert not fallbacks, f"kiln fell back to eager: {fallbacks[0]}"
    counts = Counts(graph_count(context_of(compiled)), counter.count)
    torch._dynamo.reset()
    # Where torch.compile gives up on a frame or a continuation and runs it eagerly (a break inside a loop, code
    # that raises), its count is no bound on kiln's, which compiles that part; the reason is in the case.
    # A torch.compile that captured no graph at all ran the whole function eagerly (older torch releases give up
    # on some cases newer ones capture, e.g. namedtuple._replace in 2.11): there too its count is no bound.
    if torch_gives_up is None and counts.torch > 0:
        assert counts.kiln <= counts.torch, f"kiln captured {counts.kiln} graphs, torch.compile {counts.torch}"
    return counts


def check(fn: Callable, *calls, backend: str = "eager", state: State | None = None, atol: float = 1e-5,
          rtol: float = 1e-4, torch_gives_up: str | None = None, **compile_kwargs) -> Counts:
    """Run `fn` on each call eagerly, through kiln.compile and through torch.compile; compare; count graphs."""
    return _run(lambda: fn, calls, backend, state, False, atol, rtol, compile_kwargs, torch_gives_up)


def check_module(make: Callable[[], torch.nn.Module], *calls, backend: str = "eager", atol: float = 1e-5,
                 rtol: float = 1e-4, **compile_kwargs) -> Counts:
    """`check` for a module: eager, kiln and torch.compile each get an identical copy of one `make()`."""
    torch.manual_seed(0)
    base = make()
    return _run(lambda: copy.deepcopy(base), calls, backend, None, True, atol, rtol, compile_kwargs)


def t(*shape, grad: bool = False, dtype=torch.float32) -> torch.Tensor:
    """A random tensor; `grad` makes it a leaf that requires grad."""
    if dtype.is_floating_point:
        x = torch.randn(*shape, dtype=dtype)
    elif dtype == torch.bool:
        x = torch.rand(*shape) > 0.5
    else:
        x = torch.randint(-5, 6, shape, dtype=dtype)
    return x.requires_grad_(grad)


class Table:
    """A parametrized table built by decoration: `@table(call, call, ..., marks=..., **options)` above a case."""

    def __init__(self):
        self.params = []

    def __call__(self, *calls, marks=(), **options):
        def register(fn):
            self.params.append(pytest.param(fn, calls, options, id=fn.__name__.strip("_"), marks=marks))
            return fn
        return register

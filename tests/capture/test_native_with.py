"""`with` blocks in a frame stepped through natively: entered, left on every path, and told of exceptions.

A graph break inside a loop makes kiln step the frame through natively with its calls compiled (as
torch.compile skips such a frame), and a continuation whose graph raised is stepped through natively again to
raise eager's error with eager's side effects (kiln.capture.rerun). Such a frame gets its managers natively, so
it enters them itself (`native.enter_with`) and sends an exception raised inside a block to the block's cleanup
(`native.within_handler`), whose `__exit__` sees it and may suppress it. Each case runs a program eagerly and
compiled, on fresh copies of the same module state, and compares the result, the state (a log, an attribute,
a global, printed text), grad mode after the call and the exception raised.
"""
import contextlib
import io
import types

import pytest
import torch

import kiln
from support.capture import CountingBackend, assert_same
from support.sweeps import full


@contextlib.contextmanager
def logged(value):
    """A generator manager that logs its entry and how it was left (it suppresses nothing)."""
    LOG = _current["LOG"]
    LOG.append("enter")
    try:
        yield value
    except Exception as e:
        LOG.append(("exit with", type(e).__name__))
        raise
    else:
        LOG.append("exit")


@contextlib.contextmanager
def swallowing(value):
    """A generator manager that suppresses a ValueError raised in its block."""
    try:
        yield value
    except ValueError as e:
        _current["LOG"].append(("swallowed", str(e)))


class Logged:
    """A class manager that logs what its `__exit__` sees and suppresses when told to."""

    def __init__(self, value, suppress=False, exit_raises=False):
        self.value, self.suppress, self.exit_raises = value, suppress, exit_raises

    def __enter__(self):
        _current["LOG"].append(("enter", self.value))
        return self.value

    def __exit__(self, kind, value, traceback):
        _current["LOG"].append(("exit", kind and kind.__name__, str(value) if value else None))
        if self.exit_raises:
            raise KeyError("exit failed")
        return self.suppress


class EnterOnly:
    """Not a manager: it lacks `__exit__` (CPython's TypeError says so)."""

    def __enter__(self):
        _current["LOG"].append("entered")


def step(x):
    return x.relu() * 3 + 1


def fail(x):
    raise ValueError(f"bad {x.dim()}")


# the managers, as written in the user's program
MANAGERS = {
    "no_grad": "torch.no_grad()",
    "enable_grad": "torch.enable_grad()",
    "autocast": "torch.autocast('cpu', dtype=torch.bfloat16)",
    "nullcontext": "contextlib.nullcontext(2)",
    "generator": "logged(2)",
    "suppressing generator": "swallowing(2)",
    "class": "Logged(2)",
    "suppressing class": "Logged(2, suppress=True)",
    "class whose exit raises": "Logged(2, exit_raises=True)",
    "suppress": "contextlib.suppress(ValueError)",
    "no __exit__": "EnterOnly()",
}

# a break in the loop (the print) makes the frame step through natively, with the block in the loop's body
LOOPS = {
    "normal exit": """
def f(x):
    for i in range(3):
        print(i, file=BUF)
        with {m} as v:
            LOG.append((i, type(v).__name__, torch.is_grad_enabled(), torch.is_autocast_enabled('cpu')))
            x = step(x)
            LOG.append(str(x.mm(x).dtype))
        LOG.append(('after', torch.is_grad_enabled()))
    return x, torch.is_grad_enabled()
""",
    "continue": """
def f(x):
    for i in range(3):
        print(i, file=BUF)
        with {m}:
            if i == 1:
                continue
            x = x * 2
        LOG.append(('after', i, torch.is_grad_enabled()))
    return x
""",
    "break": """
def f(x):
    for i in range(3):
        print(i, file=BUF)
        with {m}:
            x = x * 2
            if i == 1:
                break
        LOG.append(('after', i))
    OBJ.grad = torch.is_grad_enabled()
    return x
""",
    "return": """
def f(x):
    for i in range(3):
        print(i, file=BUF)
        with {m}:
            if i == 1:
                return x.sum(), torch.is_grad_enabled()
            x = x + i
    return x
""",
    "raise in a call": """
def f(x):
    global COUNT
    for i in range(3):
        print(i, file=BUF)
        with {m}:
            COUNT = COUNT + 1
            if i == 1:
                fail(x)
            x = x + 1
        LOG.append(('survived', i, torch.is_grad_enabled()))
    return x
""",
    "raise statement": """
def f(x):
    for i in range(3):
        print(i, file=BUF)
        with {m}:
            OBJ.last = i
            if i == 1:
                raise ValueError('boom')
            x = x + 1
        LOG.append(('survived', i))
    return x
""",
    "raise from a nested block": """
def f(x):
    for i in range(2):
        print(i, file=BUF)
        with {m}:
            with Logged('inner'):
                if i == 1:
                    fail(x)
                x = x + 1
            LOG.append(('between', i))
        LOG.append(('survived', i))
    return x
""",
    "wrong manager": """
def f(x):
    for i in range(2):
        print(i, file=BUF)
        with {m}:
            with x:
                LOG.append('unreachable')
    return x
""",
}

# a break inside a block, then one in a loop: the continuation (inside the block) steps its loop natively
BLOCKS_AROUND_LOOPS = {
    "the loop inside the block": """
def f(x):
    print('a', file=BUF)
    with {m}:
        print('b', file=BUF)
        out = []
        for i in range(3):
            print(i, file=BUF)
            out.append(x.mm(x) + i)
        LOG.append((torch.is_grad_enabled(), torch.is_autocast_enabled('cpu')))
    LOG.append((torch.is_grad_enabled(), torch.is_autocast_enabled('cpu')))
    return out
""",
    "a block inside the block, left by an exception": """
def f(x):
    print('a', file=BUF)
    with {m}:
        print('b', file=BUF)
        for i in range(3):
            with contextlib.suppress(ZeroDivisionError):
                print(i, file=BUF)
                x = x * 2
                LOG.append(i / (i - 1))
            LOG.append((i, torch.is_grad_enabled(), torch.is_autocast_enabled('cpu')))
    return x
""",
}

# a continuation (after the print) whose graph raises: stepped through natively again from its start
GRAPH_RAISES = {
    "raise inside the block": """
def f(x):
    print('break', file=BUF)
    LOG.append(1)
    with {m}:
        LOG.append(2)
        OBJ.seen = True
        y = x // (x * 0)
        LOG.append('unreachable')
    LOG.append(3)
    return y
""",
    "raise after the block": """
def f(x):
    print('break', file=BUF)
    with {m} as v:
        LOG.append((type(v).__name__, torch.is_grad_enabled()))
        y = x + 1
    LOG.append(torch.is_grad_enabled())
    return y[x * 0 + 9]
""",
}

_current: dict = {}


def _namespace() -> dict:
    """Fresh module state for one run of a program (its globals)."""
    namespace = {"torch": torch, "contextlib": contextlib, "logged": logged, "swallowing": swallowing,
                 "Logged": Logged, "EnterOnly": EnterOnly, "step": step, "fail": fail, "LOG": [],
                 "OBJ": types.SimpleNamespace(), "COUNT": 0, "BUF": io.StringIO()}
    _current.clear()
    _current.update(namespace)
    return namespace


def _run(source: str, compile_with: str | None, x: torch.Tensor, grad: bool):
    """Define `f` from `source` in fresh globals and call it (compiled when `compile_with` names a backend) with
    grad mode `grad`: the namespace after the call, the result, the exception, grad mode after the call."""
    namespace = _namespace()
    exec(source, namespace)
    fn = namespace["f"] if compile_with is None else kiln.compile(namespace["f"], backend=compile_with)
    with torch.set_grad_enabled(grad):
        try:
            result, error = fn(x.clone()), None
        except Exception as e:
            result, error = None, e
        grad_after = torch.is_grad_enabled()
    return namespace, result, error, grad_after


def _state(namespace: dict) -> tuple:
    return namespace["LOG"], vars(namespace["OBJ"]), namespace["COUNT"], namespace["BUF"].getvalue()


def _compare(source: str, x: torch.Tensor, grad: bool, backend: str) -> None:
    eager_ns, expected, eager_error, eager_grad = _run(source, None, x, grad)
    kiln_ns, actual, kiln_error, kiln_grad = _run(source, backend, x, grad)
    assert type(kiln_error) is type(eager_error), f"kiln raised {kiln_error!r}, eager {eager_error!r}"
    if eager_error is not None:
        assert str(kiln_error).splitlines()[0] == str(eager_error).splitlines()[0]
    assert _state(kiln_ns) == _state(eager_ns)
    assert kiln_grad == eager_grad
    assert_same(expected, actual)


def _sampled_loops() -> list:
    """Every exit path with every manager, called with grad mode on and off, under KILN_WITH_SWEEP=1; in CI a
    sample in which each path meets a third of the managers and each manager a third of the paths."""
    every = [(loop, manager, grad) for i, loop in enumerate(LOOPS) for j, manager in enumerate(MANAGERS)
             for grad in (True, False)]
    if full("KILN_WITH_SWEEP"):
        return every
    names, managers = list(LOOPS), list(MANAGERS)
    return [(loop, manager, grad) for loop, manager, grad in every
            if (names.index(loop) + managers.index(manager)) % 3 == 0 and grad == (managers.index(manager) % 2 == 0)]


@pytest.mark.allows_fallback("graph_break: the print in the loop, which torch.compile breaks on too")
@pytest.mark.parametrize("loop,manager,grad", _sampled_loops())
def test_a_block_in_a_natively_stepped_loop_behaves_as_eager(loop, manager, grad):
    _compare(LOOPS[loop].format(m=MANAGERS[manager]), torch.ones(2, 2), grad, "eager")


@pytest.mark.allows_fallback("graph_break: the prints, which torch.compile breaks on too")
@pytest.mark.parametrize("manager", ["no_grad", "enable_grad", "autocast", "class", "suppressing class"])
@pytest.mark.parametrize("program", BLOCKS_AROUND_LOOPS)
def test_a_stepped_loop_inside_a_block_behaves_as_eager(program, manager):
    _compare(BLOCKS_AROUND_LOOPS[program].format(m=MANAGERS[manager]), torch.ones(2, 2, requires_grad=True),
             True, "eager")


@pytest.mark.allows_fallback("graph_break: the print before the raising graph")
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("manager", MANAGERS)
@pytest.mark.parametrize("program", GRAPH_RAISES)
def test_a_block_in_a_rerun_continuation_behaves_as_eager(program, manager, backend):
    _compare(GRAPH_RAISES[program].format(m=MANAGERS[manager]), torch.arange(1, 5), True, backend)


@pytest.mark.allows_fallback("graph_break: the print in the loop, which torch.compile breaks on too")
@pytest.mark.parametrize("manager", [m for m in MANAGERS if m not in ("class whose exit raises", "no __exit__")])
def test_a_function_called_in_a_block_of_a_stepped_loop_is_compiled_as_torch_compile_does(manager):
    """torch.compile skips the frame and compiles `step` as a frame of its own; kiln steps the frame natively
    and compiles `step` (before, it ran the frame eagerly, `step` uncompiled): the same graphs."""
    source = LOOPS["normal exit"].format(m=MANAGERS[manager])
    torch._dynamo.reset()
    reference = CountingBackend()
    namespace = _namespace()
    exec(source, namespace)
    expected = torch.compile(namespace["f"], backend=reference)(torch.ones(2, 2))
    backend = CountingBackend()
    namespace = _namespace()
    exec(source, namespace)
    assert_same(expected, kiln.compile(namespace["f"], backend=backend)(torch.ones(2, 2)))
    assert backend.graphs == reference.graphs >= 1

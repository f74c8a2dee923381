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
import traceback
import types

import pytest
import torch

import kiln
from kiln import fallbacks
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


@contextlib.contextmanager
def reraising(value):
    """A generator manager that turns a ValueError raised in its block into another exception, chained."""
    try:
        yield value
    except ValueError as e:
        _current["LOG"].append(("reraising", str(e)))
        raise KeyError("other") from e


class Traced:
    """A class manager that logs the exception `__exit__` is given: its type, value, whether the traceback is the
    exception's own, and the traceback's innermost frame (function, line number, source line); it suppresses
    when told to."""

    def __init__(self, suppress=False):
        self.suppress = suppress

    def __enter__(self):
        return 2

    def __exit__(self, kind, value, tb):
        innermost = [(f.name, f.lineno, f.line) for f in traceback.extract_tb(tb)][-1:] if tb is not None else []
        _current["LOG"].append(("exit", kind and kind.__name__, str(value) if value else None,
                                tb is (value.__traceback__ if value is not None else None), innermost))
        return self.suppress


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
    "generator raising another": "reraising(2)",
    "class": "Logged(2)",
    "suppressing class": "Logged(2, suppress=True)",
    "class whose exit raises": "Logged(2, exit_raises=True)",
    "class reading the traceback": "Traced()",
    "suppressing class reading the traceback": "Traced(suppress=True)",
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
    "raise from": """
def f(x):
    for i in range(3):
        print(i, file=BUF)
        with {m}:
            if i == 1:
                raise ValueError('boom') from KeyError('cause')
            x = x + 1
        LOG.append(('survived', i))
    return x
""",
    "raise in the graph": """
def f(x):
    for i in range(2):
        print(i, file=BUF)
        with {m}:
            LOG.append(i)
            x = x + x[(x * 0).long() + 9 * i]
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

# a break inside a block (no loop): the continuation resumes inside it, as torch.compile's does
BREAKS_IN_BLOCKS = {
    "normal exit": """
def f(x):
    with {m} as v:
        x = x + 1
        print('break', file=BUF)
        x = x * 2
        LOG.append((torch.is_grad_enabled(), torch.is_autocast_enabled('cpu')))
    LOG.append(('after', torch.is_grad_enabled(), torch.is_autocast_enabled('cpu')))
    return x
""",
    "raise statement": """
def f(x):
    with {m} as v:
        x = x + 1
        print('break', file=BUF)
        if x.sum() > 0:
            raise ValueError('boom')
    LOG.append('after')
    return x
""",
    "raise in a call": """
def f(x):
    with {m}:
        print('break', file=BUF)
        OBJ.seen = True
        fail(x)
    LOG.append('after')
    return x
""",
    "raise in the graph": """
def f(x):
    with {m}:
        print('break', file=BUF)
        LOG.append(1)
        y = x[x * 0 + 9]
    LOG.append('after')
    return y
""",
    "return": """
def f(x):
    with {m}:
        print('break', file=BUF)
        return x * 2, torch.is_grad_enabled()
""",
    "raise through nested blocks": """
def f(x):
    with {m}:
        with Logged('inner'):
            x = x + 1
            print('break', file=BUF)
            fail(x)
        LOG.append('between')
    LOG.append('after')
    return x
""",
    "raise in a block inside a grad-mode block": """
def f(x):
    with torch.no_grad():
        with {m}:
            print('break', file=BUF)
            y = x * 2
            LOG.append(torch.is_grad_enabled())
            fail(x)
        LOG.append(torch.is_grad_enabled())
    return y
""",
    "a variable the raise left unbound": """
def f(x):
    with {m}:
        print('break', file=BUF)
        y = x + 1
        fail(x)
        z = y * 2
    LOG.append('after')
    return z
""",
}

# breaks inside blocks of managers written in Python (`{m}`, `{n}`), no loop: kiln captures the code around the
# break as graphs, as torch.compile does around a break inside grad-mode blocks (each placeholder then
# `torch.enable_grad()`)
AROUND_BREAKS = {
    "one block": """
def f(x):
    y = x.sin()
    with {m} as v:
        x = x + 1
        print('break', file=BUF)
        x = x * 2
    return x + y
""",
    "nested blocks": """
def f(x):
    with {m}:
        x = x + 1
        with {n}:
            x = x * 2
            print('break', file=BUF)
            x = x - 1
        x = x.cos()
    return x
""",
    "a block in a grad-mode block": """
def f(x):
    with torch.no_grad():
        x = x + 1
        with {m}:
            print('break', file=BUF)
            x = x * 2
        x = x.exp()
    return x, torch.is_grad_enabled()
""",
    "a break before the block": """
def f(x):
    x = x + 1
    print('break', file=BUF)
    with {m}:
        x = x * 2
    return x.cos()
""",
}

# the managers written in Python among MANAGERS (a generator manager cannot be handed on: see the last test)
PYTHON_CLASS_MANAGERS = ["nullcontext", "class", "suppressing class", "class reading the traceback", "suppress"]

_current: dict = {}


def _namespace() -> dict:
    """Fresh module state for one run of a program (its globals)."""
    namespace = {"torch": torch, "contextlib": contextlib, "logged": logged, "swallowing": swallowing,
                 "reraising": reraising, "Traced": Traced, "Logged": Logged, "EnterOnly": EnterOnly, "step": step,
                 "fail": fail, "LOG": [],
                 "OBJ": types.SimpleNamespace(), "COUNT": 0, "BUF": io.StringIO()}
    _current.clear()
    _current.update(namespace)
    return namespace


def _run(source: str, compile_with: str | None, x: torch.Tensor, grad: bool):
    """Define `f` from `source` in fresh globals and call it (compiled when `compile_with` names a backend) with
    grad mode `grad`: the namespace after the call, the result, the exception, grad mode and autocast after the
    call."""
    namespace = _namespace()
    exec(source, namespace)
    fn = namespace["f"] if compile_with is None else kiln.compile(namespace["f"], backend=compile_with)
    with torch.set_grad_enabled(grad):
        try:
            result, error = fn(x.clone()), None
        except Exception as e:
            result, error = None, e
        modes_after = torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")
    return namespace, result, error, modes_after


def _state(namespace: dict) -> tuple:
    return namespace["LOG"], vars(namespace["OBJ"]), namespace["COUNT"], namespace["BUF"].getvalue()


def _compare(source: str, x: torch.Tensor, grad: bool, backend: str) -> None:
    eager_ns, expected, eager_error, eager_modes = _run(source, None, x, grad)
    kiln_ns, actual, kiln_error, kiln_modes = _run(source, backend, x, grad)
    assert type(kiln_error) is type(eager_error), f"kiln raised {kiln_error!r}, eager {eager_error!r}"
    if eager_error is not None:
        assert str(kiln_error).splitlines()[0] == str(eager_error).splitlines()[0]
        assert _chain(kiln_error) == _chain(eager_error)
    assert _state(kiln_ns) == _state(eager_ns)
    assert kiln_modes == eager_modes
    assert_same(expected, actual)


def _chain(error: BaseException) -> list:
    """The exceptions `error` was raised from or while handling (its `__cause__` or `__context__`, outermost
    first), as CPython chains them: a generator manager raising another, an `__exit__` that raises."""
    chain = []
    while error is not None:
        chain.append((type(error).__name__, str(error).splitlines()[0] if str(error) else "",
                      error.__cause__ is not None, error.__suppress_context__))
        error = error.__cause__ or error.__context__
    return chain


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


@pytest.mark.sampled(every=2, classes=("program", "manager"))
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


@pytest.mark.allows_fallback("graph_break: the print inside the block, which torch.compile breaks on too")
@pytest.mark.parametrize("manager", MANAGERS)
@pytest.mark.parametrize("program", BREAKS_IN_BLOCKS)
def test_a_break_inside_a_block_behaves_as_eager(program, manager):
    """`__exit__` gets what Python gives it (the exception's type, value and traceback, or three Nones), a
    generator manager gets the exception thrown in and may suppress it or raise another, and an `__exit__`
    returning True suppresses: the same log, result, exception (chained as in eager) and modes as eager."""
    _compare(BREAKS_IN_BLOCKS[program].format(m=MANAGERS[manager]), torch.arange(1, 5), True, "eager")


class GraphOps:
    """A backend counting the graphs handed to it and the tensor operations in them."""

    def __init__(self):
        self.graphs, self.ops = 0, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        self.ops += sum(node.op in ("call_function", "call_method") and "grad_enabled" not in str(node.target)
                        for node in gm.graph.nodes)
        return gm.forward


def _graphs_of(source: str, compile_fn) -> GraphOps:
    namespace = _namespace()
    exec(source, namespace)
    backend = GraphOps()
    compile_fn(namespace["f"], backend=backend)(torch.ones(3))
    return backend


@pytest.mark.sampled(every=2, classes=("program", "manager"))
@pytest.mark.allows_fallback("graph_break: the print, which torch.compile breaks on too")
@pytest.mark.parametrize("manager", PYTHON_CLASS_MANAGERS)
@pytest.mark.parametrize("program", AROUND_BREAKS)
def test_the_code_around_a_break_in_a_python_managers_block_is_captured(program, manager):
    """kiln resumes inside the block of a manager written in Python as inside a grad-mode block: the graphs, and
    the operations in them, are those torch.compile captures when the block is `torch.enable_grad()`. (On the
    program itself torch.compile skips the frame, "graph break under GenericContextWrappingVariable", and
    captures fewer.) The continuation calls the manager's `__exit__`; the results are eager's."""
    source = AROUND_BREAKS[program]
    python = source.format(m=MANAGERS[manager], n="Logged('inner')")
    _compare(python, torch.ones(3, requires_grad=True), True, "eager")
    kiln_graphs = _graphs_of(python, kiln.compile)
    torch._dynamo.reset()
    grad_mode = source.format(m="torch.enable_grad()", n="torch.enable_grad()")
    reference = _graphs_of(grad_mode, torch.compile)
    assert (kiln_graphs.graphs, kiln_graphs.ops) == (reference.graphs, reference.ops) == (2, reference.ops)
    assert _ops_torch_compile_captures(python) <= kiln_graphs.ops


def _ops_torch_compile_captures(source: str) -> int:
    """The operations torch.compile puts in graphs for the program as written; none where it fails on it (an
    internal error on `contextlib.nullcontext(2)` across a break)."""
    torch._dynamo.reset()
    try:
        return _graphs_of(source, torch.compile).ops
    except torch._dynamo.exc.InternalTorchDynamoError:
        return 0


@pytest.mark.allows_fallback("graph_break: the print inside the block, which torch.compile breaks on too")
@pytest.mark.parametrize("manager", ["suppressing class", "class whose exit raises", "suppress"])
def test_a_graph_raising_in_a_block_whose_exit_handles_it_is_no_fallback(manager):
    """The continuation's graph raises inside the block, and the re-run from its start gives eager's outcome,
    which the manager's `__exit__` decides (it suppresses the error, or raises another): that is not a graph
    raising what eager does not, and no fallback is recorded (the print's break is one torch.compile takes too)."""
    _compare(BREAKS_IN_BLOCKS["raise in the graph"].format(m=MANAGERS[manager]), torch.arange(1, 5), True, "eager")
    assert fallbacks.records() == []


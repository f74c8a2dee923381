"""A compiled graph that raises at run time leaves Python state as eager leaves it, and raises eager's error.

kiln replays a frame's side effects after its graph runs; when the graph raises, the frame runs again
eagerly from its start (kiln.capture.rerun), so the effects written before the raising op happen, those
after it do not, and the exception is eager's. Each case runs eagerly and compiled on fresh copies of the
same module-level state (a list, a dict, an object, a global, a print buffer) and compares them.
"""
import io
import types
import warnings

import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", "inductor"]

# ops that raise at run time on valid shapes: what eager checks in its kernels
RAISING_OPS = {
    "floor_divide by zero": "t // (t * 0)",
    "remainder by zero": "t % (t - t)",
    "index_select out of range": "t.index_select(0, t * 0 + 7)",
    "gather out of range": "t.gather(0, t * 0 + 9)",
    "advanced index out of range": "t[t * 0 - 8]",
}
# every kind of side effect before the raising op (a print is a graph break: below), and some after it
# (which eager never reaches)
PROGRAM = """
def f(x):
    t = x.cumsum(0)
    LOG.append(int(t.shape[0]))
    TABLE['n'] = t.dim()
    OBJ.seen = True
    global COUNT
    COUNT = COUNT + 1
    bad = {op}
    LOG.append('after')
    OBJ.after = True
    return bad.sum() + t
"""


def _namespace() -> dict:
    """Fresh module state for one run of a program (its globals)."""
    return {"torch": torch, "LOG": [], "TABLE": {}, "OBJ": types.SimpleNamespace(), "COUNT": 0, "BUF": io.StringIO()}


def _run(source: str, compile_with: str | None, *args):
    """Define `f` from `source` in fresh globals, call it (compiled when `compile_with` names a backend)."""
    namespace = _namespace()
    exec(source, namespace)
    fn = namespace["f"] if compile_with is None else kiln.compile(namespace["f"], backend=compile_with)
    try:
        result, error = fn(*args), None
    except Exception as e:
        result, error = None, e
    return namespace, result, error


def _state(namespace: dict) -> dict:
    return {"LOG": namespace["LOG"], "TABLE": namespace["TABLE"], "OBJ": vars(namespace["OBJ"]),
            "COUNT": namespace["COUNT"], "BUF": namespace["BUF"].getvalue()}


def _check_like_eager(source: str, backend: str, *args):
    """`f` compiled raises what eager raises and leaves the same state; returns both namespaces."""
    eager_ns, _, eager_error = _run(source, None, *(a.clone() for a in args))
    kiln_ns, _, kiln_error = _run(source, backend, *(a.clone() for a in args))
    assert eager_error is not None, "the case must raise in eager"
    assert type(kiln_error) is type(eager_error), f"kiln raised {kiln_error!r}, eager {eager_error!r}"
    assert str(kiln_error) == str(eager_error)
    assert _state(kiln_ns) == _state(eager_ns)
    return eager_ns, kiln_ns


@pytest.mark.sampled(every=3, classes=("op",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(RAISING_OPS))
def test_side_effects_before_a_raising_op_are_kept(op, backend):
    eager_ns, _ = _check_like_eager(PROGRAM.format(op=RAISING_OPS[op]), backend, torch.arange(1, 5))
    assert eager_ns["LOG"] == [4] and eager_ns["COUNT"] == 1  # the case is what it claims


@pytest.mark.parametrize("backend", BACKENDS)
def test_print_before_a_raising_op_is_kept(backend):
    """`print` breaks the graph and runs natively, before the graph that raises (a continuation's)."""
    source = """
def f(x):
    LOG.append(1)
    print('before', x.shape[0], file=BUF)
    return x % (x * 0)
"""
    eager_ns, _, eager_error = _run(source, None, torch.arange(1, 4))
    kiln_ns, _, kiln_error = _run(source, backend, torch.arange(1, 4))
    assert type(kiln_error) is type(eager_error) and str(eager_error) in str(kiln_error)
    assert _state(kiln_ns) == _state(eager_ns) and eager_ns["BUF"].getvalue() == "before 3\n"


# the rest of a function after a graph break (a continuation) whose graph raises: it has no Python function to
# call again, so it is stepped through natively from its start; effects before the break ran once already
CONTINUATIONS = {
    "effects after the break": """
def f(x):
    LOG.append(1)
    print('break', file=BUF)
    LOG.append(2)
    OBJ.seen = True
    global COUNT
    COUNT = COUNT + 1
    bad = {op}
    LOG.append('after')
    return bad
""",
    "a loop after the break": """
def f(x):
    print('break', file=BUF)
    for i in range(3):
        LOG.append(i)
        TABLE[i] = x.shape[0]
    return {op}
""",
    "an input written after the break": """
def f(x):
    print('break', file=BUF)
    x.mul_(2)
    LOG.append(1)
    return {op}
""",
    "two breaks": """
def f(x):
    LOG.append(1)
    print('one', file=BUF)
    LOG.append(2)
    print('two', file=BUF)
    OBJ.n = 3
    return {op}
""",
    "a break in an inlined call": """
def helper(x):
    print('inner', file=BUF)
    OBJ.inner = True
    return {op}

def f(x):
    LOG.append('outer')
    return helper(x) + 1
""",
}


@pytest.mark.sampled(every=3, classes=("case", "op"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["floor_divide by zero", "advanced index out of range"])
@pytest.mark.parametrize("case", list(CONTINUATIONS))
def test_a_continuation_that_raises_keeps_its_effects_once(case, op, backend):
    source = CONTINUATIONS[case].format(op=RAISING_OPS[op].replace("t", "x"))
    x = torch.arange(1, 5)
    eager_ns, _, eager_error = _run(source, None, x)
    kx = torch.arange(1, 5)
    kiln_ns, _, kiln_error = _run(source, backend, kx)
    assert eager_error is not None and type(kiln_error) is type(eager_error) and str(kiln_error) == str(eager_error)
    assert _state(kiln_ns) == _state(eager_ns) and eager_ns["BUF"].getvalue()
    assert torch.equal(kx, x)


# A continuation whose graph raised is stepped through again natively to raise eager's error; a `with` block it
# meets there is on a manager its native step made, which it enters itself (`native.enter_with`; it raised "kiln
# cannot resume this frame", then the graph's own exception without the effects between the break and the raise).
# More managers and exits: tests/capture/test_native_with.py.
WITH_BLOCK_CONTINUATIONS = {
    "a no_grad block after the break": """
def f(x):
    print('break', file=BUF)
    LOG.append(1)
    with torch.no_grad():
        y = x + 1
    return {op} + y
""",
    "the raise inside a no_grad block after the break": """
def f(x):
    print('break', file=BUF)
    LOG.append(1)
    with torch.no_grad():
        y = {op}
    return y
""",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["floor_divide by zero", "advanced index out of range"])
@pytest.mark.parametrize("case", list(WITH_BLOCK_CONTINUATIONS))
def test_a_continuation_that_raises_in_a_with_block_raises_eagers_error(case, op, backend):
    source = WITH_BLOCK_CONTINUATIONS[case].format(op=RAISING_OPS[op].replace("t", "x"))
    eager_ns, _, eager_error = _run(source, None, torch.arange(1, 5))
    kiln_ns, _, kiln_error = _run(source, backend, torch.arange(1, 5))
    assert eager_error is not None and type(kiln_error) is type(eager_error)
    assert str(kiln_error) == str(eager_error)  # eager's own error: the re-run raised it
    assert kiln_ns["BUF"].getvalue() == "break\n"  # the effects before the break, replayed once
    assert _state(kiln_ns) == _state(eager_ns) and torch.is_grad_enabled()


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_numbers_are_drawn_once(backend):
    """The re-run draws the graph's random numbers again from the generator's state before the graph."""
    source = """
def f(x):
    noise = torch.rand(3)
    LOG.append(noise)
    return x // (x * 0) + noise
"""
    torch.manual_seed(0)
    eager_ns, _, eager_error = _run(source, None, torch.arange(1, 4))
    eager_next = torch.rand(2)
    torch.manual_seed(0)
    kiln_ns, _, kiln_error = _run(source, backend, torch.arange(1, 4))
    assert type(kiln_error) is type(eager_error) is RuntimeError
    assert len(kiln_ns["LOG"]) == 1 and torch.equal(kiln_ns["LOG"][0], eager_ns["LOG"][0])
    assert torch.equal(torch.rand(2), eager_next)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_input_written_before_the_raise_is_written_once(backend):
    """kiln's own backends write mutated inputs back after the graph: nothing was written, the re-run is exact."""
    source = """
def f(x, y):
    x.mul_(2)
    LOG.append(1)
    return (x + y) // (y * 0)
"""
    x, y = torch.arange(1, 4), torch.arange(1, 4)
    eager_ns, _, _ = _run(source, None, x, y)
    cx = torch.arange(1, 4)
    kiln_ns, _, error = _run(source, backend, cx, y)
    assert isinstance(error, RuntimeError) and kiln_ns["LOG"] == eager_ns["LOG"] == [1]
    assert torch.equal(cx, x)


# writes into an input (or a view of one) before the raising op, which the capture-only backend and a graph
# run op by op make in place, as they go
INPUT_WRITES = {
    "add_": "x.add_(1)",
    "copy_": "x.copy_(x * 3)",
    "index_put_": "x[t * 0 + 1] = 5",
    "add_ into a view": "x[1:].add_(2)",
    "copy_ into a view": "x.view(2, -1)[0].copy_(t[:2])",
    "in-place op of a view of a view": "x[::2][1:].mul_(4)",
}
WRITING_PROGRAM = """
def f(x):
    t = x.cumsum(0)
    LOG.append(int(t.shape[0]))
    {write}
    OBJ.written = True
    bad = {op}
    LOG.append('after')
    return bad
"""


@pytest.mark.sampled(every=3, classes=("op", "write"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("write", list(INPUT_WRITES))
@pytest.mark.parametrize("op", ["floor_divide by zero", "gather out of range", "advanced index out of range"])
def test_an_input_written_before_a_raising_op_is_written_once(op, write, backend):
    """The inputs a graph writes are copied before a graph that may raise on values runs, and put back
    before the frame re-runs eagerly: the input ends as eager leaves it (written once), the effects
    before the raise are kept."""
    _check_written_once(WRITING_PROGRAM.format(write=INPUT_WRITES[write], op=RAISING_OPS[op]), backend)


def _check_written_once(source: str, backend: str) -> None:
    """`f(x)` compiled raises eager's error, keeps the effects before it, and leaves `x` written once, as eager."""
    x = torch.arange(1, 5)
    eager_ns, _, eager_error = _run(source, None, x)
    kx = torch.arange(1, 5)
    kiln_ns, _, kiln_error = _run(source, backend, kx)
    assert eager_error is not None and type(kiln_error) is type(eager_error) and str(kiln_error) == str(eager_error)
    assert _state(kiln_ns) == _state(eager_ns) and eager_ns["LOG"] == [4]
    assert torch.equal(kx, x) and not torch.equal(x, torch.arange(1, 5))  # written once, as in eager


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_and_its_alias_written_before_a_raise_are_restored(backend):
    """Two inputs sharing memory (`f(x, x[1:])`), both written: each is put back from its copy, last first."""
    source = """
def f(x, y):
    x.mul_(2)
    y.add_(1)
    LOG.append(1)
    return x.index_select(0, x * 0 + 9)
"""
    base = torch.arange(1, 5)
    eager_ns, _, eager_error = _run(source, None, base, base[1:])
    kbase = torch.arange(1, 5)
    kiln_ns, _, kiln_error = _run(source, backend, kbase, kbase[1:])
    assert type(kiln_error) is type(eager_error) is IndexError
    assert _state(kiln_ns) == _state(eager_ns) and torch.equal(kbase, base)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_through_an_input_written_before_a_raise_count_the_write_once(backend):
    """A non-leaf input that requires grad, written before the raise: restored with its history, so the
    gradient afterwards goes through one write, as in eager."""
    source = """
def f(h, i):
    h.mul_(3)
    LOG.append(1)
    return h[i]
"""
    grads = []
    for compile_with in (None, backend):
        w = torch.ones(3, requires_grad=True)
        h = w * 2
        namespace, _, error = _run(source, compile_with, h, torch.tensor([5]))
        assert isinstance(error, IndexError) and namespace["LOG"] == [1]
        h.sum().backward()
        grads.append((h.detach(), w.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_an_input_a_write_made_require_grad_is_detached_again():
    """`x.copy_(w)` with `w` requiring grad gives `x` a history; restored, `x` loses it again, and the re-run's
    write gives it back once (the gradient reaching `w` counts one copy)."""
    source = """
def f(x, w, i):
    x.copy_(w * 2)
    LOG.append(1)
    return x[i]
"""
    grads = []
    for compile_with in (None, "eager"):
        w = torch.ones(3, requires_grad=True)
        x = torch.zeros(3)
        _, _, error = _run(source, compile_with, x, w, torch.tensor([5]))
        assert isinstance(error, IndexError) and x.requires_grad
        x.sum().backward()
        grads.append(w.grad)
    assert torch.equal(grads[0], grads[1])


def test_a_graph_without_value_checks_copies_no_input(monkeypatch):
    """Only a graph with an op that may raise on values pays for the copy of its written inputs."""
    copies = []
    real = kiln.capture.rerun.snapshot_inputs
    monkeypatch.setattr(kiln.capture.rerun, "snapshot_inputs", lambda *t: copies.append(len(t)) or real(*t))

    def plain(x):
        x.add_(1)
        return x * 2

    def checked(x, i):
        x.add_(1)
        return x[i]

    kiln.compile(plain, backend="eager")(torch.ones(3))
    assert copies == []
    kiln.compile(checked, backend="eager")(torch.ones(3), torch.tensor([1]))
    assert copies == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_mode_is_restored_after_a_raise_inside_no_grad(backend):
    source = """
def f(x):
    LOG.append(torch.is_grad_enabled())
    with torch.no_grad():
        y = x // (x * 0)
    return y
"""
    _check_like_eager(source, backend, torch.arange(1, 4))
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_raise_in_an_inlined_call_keeps_the_callers_effects(backend):
    source = """
def helper(t):
    OBJ.inner = t.shape[0]
    return t.index_select(0, t * 0 + 5)

def f(x):
    LOG.append('outer')
    return helper(x) + 1
"""
    _check_like_eager(source, backend, torch.arange(3))


@pytest.mark.allows_fallback("frame: the graph raises where eager does not, so the frame runs eagerly")
def test_a_graph_raising_where_eager_does_not_returns_eagers_result_and_warns():
    """A backend bug that raises is not the user's error: the frame's eager result comes back, with a warning."""
    def broken_backend(gm, example_inputs):
        def run(*args):
            raise RuntimeError("backend bug")
        return run

    log = []

    def f(x):
        log.append(1)
        return x * 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kiln.compile(f, backend=broken_backend)(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0)) and log == [1]
    assert any("backend bug" in str(w.message) for w in caught)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_raise_inside_an_autocast_block_keeps_the_effects_before_it(backend):
    """kiln's backends trace autocast into casts; the capture-only backend runs the block's enter and exit
    as graph ops, and a raise between them leaves the block open: the program leaves it, as `with` does."""
    source = """
def f(x):
    LOG.append(1)
    with torch.autocast("cpu"):
        y = x // (x * 0)
    return y
"""
    _check_like_eager(source, backend, torch.arange(1, 4))
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_raise_inside_nested_autocast_blocks_restores_the_callers_autocast(backend):
    """Called inside the user's own autocast block, a frame raising inside two more of its own leaves the
    user's block on, with its dtype, as eager does; and the user's block still closes cleanly."""
    source = """
def f(x):
    LOG.append(torch.get_autocast_dtype("cpu"))
    with torch.autocast("cpu", dtype=torch.float16):
        with torch.autocast("cpu", enabled=False):
            y = x[x * 0 + 7]
    return y
"""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _check_like_eager(source, backend, torch.arange(1, 4))
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.allows_fallback("frame: the graph raises where eager does not, so the frame runs eagerly")
def test_a_graph_raising_other_than_eager_raises_eagers_error_and_warns():
    """The graph's ValueError is a backend bug; the frame re-run eagerly raises the user's KeyError, alone
    (not "during handling of" kiln's exception)."""
    def raises(gm, example_inputs):
        def run(*args):
            raise ValueError("backend bug")
        return run

    def f(x):
        y = x * 2
        return {"y": y}["missing"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError) as info:
            kiln.compile(f, backend=raises)(torch.ones(2))
    assert info.value.__context__ is None
    assert any("running it eagerly raised KeyError" in str(w.message) for w in caught)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_checks_that_cuda_makes_device_asserts_take_no_copy_on_the_gpu(device):
    """On the GPU an index or class check is a device-side assert (no exception at the op, and a CUDA context no
    re-run survives) and an integer division by zero raises nothing: a CUDA graph with only those needs no copy of
    the inputs it writes, which a CNN's training step otherwise takes each step (its batch counters, for the
    loss's class check). A check the host makes (a factorization's) still counts on either device."""
    from kiln.capture.graph import WatchingFakeMode
    from support.fake_cuda import allow_fake_cuda

    allow_fake_cuda()
    aten = torch.ops.aten

    def checks(op, *args, **kwargs):
        """Whether capture's fake mode notes a value check in `op` run on fakes of `args` ((shape, dtype) pairs
        are tensors made on `device`)."""
        with WatchingFakeMode() as mode:
            op(*[torch.empty(a[0], dtype=a[1], device=device) if isinstance(a, tuple) else a for a in args],
               **kwargs)
        return mode.checks_values

    logits, classes, info = ((4, 3), torch.float32), ((4,), torch.int64), ((), torch.int32)
    on_gpu = device == "cuda"
    assert checks(aten.nll_loss_forward, logits, classes, None, 1, -100) != on_gpu
    assert checks(aten.index_select, logits, 0, classes) != on_gpu
    assert checks(aten.floor_divide, classes, classes) != on_gpu
    assert checks(aten.floor_divide, logits, logits) is False  # floats divide by zero without raising anywhere
    assert checks(aten._linalg_check_errors, info, "cholesky", is_matrix=True) is True


# ops eager raises on by their operands' types or layout, which fake tensors do not check: a graph with one runs
# op by op to raise as eager does (kiln/autograd/eager_errors.py)
DOOMED_OPS = {
    "subtraction of a bool tensor": "(t > 2) - 1",
    "in-place result that cannot be cast": "(t > 0).mul_(2.5)",
    "max of an empty tensor": "t[:0].max()",
    "write into an expanded tensor": "t[:1].expand(4).add_(1)",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(DOOMED_OPS))
def test_an_input_written_before_a_doomed_op_is_written_once(op, backend):
    """A graph that eager's type or layout checks doom writes its inputs as it runs op by op: capture copies them
    before it runs, as for an op that checks values, so that the frame re-runs eagerly from them (fuzz seed 571235:
    a closure's state, changed before the raise, was lost with the re-run)."""
    _check_written_once(WRITING_PROGRAM.format(write="x.add_(1)", op=DOOMED_OPS[op]), backend)

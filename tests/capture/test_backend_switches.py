"""Generator context managers whose bodies change process state, and torch.backends' switches, in one graph.

A `@contextlib.contextmanager` generator is traced like any Python code: its body's writes to a global, to a
module's attribute or to a torch.backends switch (`torch.backends.cudnn.flags(enabled=False)` around
transformers' CTC loss; `torch.backends.cudnn.benchmark = True` in a user's manager) are replayed after the
graph, reads of a switch are guarded, and the state after the call is eager's, also when the block raises.
Results and state are compared with eager's; graph counts with torch.compile's, measured here.
"""
import contextlib
import types

import pytest
import torch
import torch._dynamo

import kiln
from kiln import fallbacks
from kiln.api import context_of
from support.capture import CountingBackend, assert_same


@pytest.fixture(autouse=True)
def switches_settable(monkeypatch):
    """torch's own test utilities (imported by the OpInfo tests in the same worker) freeze the torch.backends
    flags at import (`disable_global_flags`), after which setting one raises: these tests set them as a user's
    program does."""
    monkeypatch.setitem(torch.backends.flags_frozen.__globals__, "__allow_nonbracketed_mutation_flag", True)


CONFIG = types.ModuleType("config")
CONFIG.level = 0
LEVEL = 0


@contextlib.contextmanager
def global_set(value):
    global LEVEL
    old, LEVEL = LEVEL, value
    try:
        yield old
    finally:
        LEVEL = old


@contextlib.contextmanager
def module_attribute_set(value):
    old, CONFIG.level = CONFIG.level, value
    try:
        yield
    finally:
        CONFIG.level = old


@contextlib.contextmanager
def cudnn_benchmark_on():
    """A user's own manager over a torch.backends switch, written through the module's attribute."""
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield torch.backends.cudnn.benchmark
    finally:
        torch.backends.cudnn.benchmark = old


def in_global_block(x):
    with global_set(3) as old:
        y = x * LEVEL + old
    return y.sin(), LEVEL


def in_module_attribute_block(x):
    with module_attribute_set(5):
        y = x * CONFIG.level
    return y.cos(), CONFIG.level


def in_user_switch_block(x):
    with cudnn_benchmark_on() as on:
        y = x * 2 + on
    return y.sin(), torch.backends.cudnn.benchmark


def in_cudnn_flags_block(x):
    """transformers' ForCTCLoss does its loss under `torch.backends.cudnn.flags(enabled=False)`."""
    y = x * 2
    with torch.backends.cudnn.flags(enabled=False, deterministic=True):
        y = y.log_softmax(-1) + torch.backends.cudnn.enabled
        inside = torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic
    return y.exp(), inside, (torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic)


def switch_state() -> tuple:
    return (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
            torch.backends.mkldnn.enabled, torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), LEVEL, CONFIG.level)


class OpCounter(CountingBackend):
    """Counts the graphs and the ops each holds."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __call__(self, gm, example_inputs):
        self.ops.append(sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method")))
        return super().__call__(gm, example_inputs)


def graphs_of(compiler, fn, *args):
    """(fn's output, the number of ops in each graph `compiler` captured for it)."""
    counter = OpCounter()
    if compiler is torch.compile:
        torch._dynamo.reset()
    out = compiler(fn, backend=counter)(*args)
    torch._dynamo.reset()
    return out, counter.ops


@pytest.mark.parametrize("fn", [in_global_block, in_module_attribute_block, in_user_switch_block])
def test_a_generator_managers_writes_stay_in_one_graph_as_under_torch_compile(fn):
    x = torch.randn(4)
    before = switch_state()
    expected = fn(x)
    ours, kiln_graphs = graphs_of(kiln.compile, fn, x)
    assert switch_state() == before
    _, torch_graphs = graphs_of(torch.compile, fn, x)
    assert_same(expected, ours)
    assert len(kiln_graphs) == len(torch_graphs) == 1


def test_cudnn_flags_block_is_in_the_graph_where_torch_compile_runs_it_eagerly():
    """torch.compile calls `torch.backends.cudnn.flags` as a torch op that returns no tensor (a break) and then
    cannot enter the manager, so it runs the rest of the frame eagerly; kiln traces the manager's Python and
    captures the whole function in one graph."""
    x = torch.randn(2, 5)
    before = switch_state()
    expected = in_cudnn_flags_block(x)
    ours, kiln_graphs = graphs_of(kiln.compile, in_cudnn_flags_block, x)
    assert switch_state() == before
    _, torch_graphs = graphs_of(torch.compile, in_cudnn_flags_block, x)
    assert_same(expected, ours)
    assert expected[1:] == ((False, True), (True, False))
    assert torch_graphs == [1]  # `x * 2`, before the manager
    assert kiln_graphs == [4]  # mul, log_softmax, add, exp: the switches read inside the block are constants


def raises_in_cudnn_flags_block(x):
    with torch.backends.cudnn.flags(enabled=False, benchmark=True):
        y = x * 2
        if y.shape[0] == 3:
            raise ValueError("inside the block")
    return y


def raises_in_user_switch_block(x):
    with cudnn_benchmark_on(), global_set(7):
        x = x + LEVEL
        raise KeyError("inside the block")


@pytest.mark.parametrize("fn", [raises_in_cudnn_flags_block, raises_in_user_switch_block])
def test_switches_are_restored_as_eager_restores_them_when_the_block_raises(fn):
    before = switch_state()
    with pytest.raises(Exception) as eager:
        fn(torch.randn(3))
    assert switch_state() == before
    with pytest.raises(eager.type, match=str(eager.value)):
        kiln.compile(fn, backend="eager")(torch.randn(3))
    assert switch_state() == before


def indexes_in_cudnn_flags_block(x, index):
    with torch.backends.cudnn.flags(enabled=False, benchmark=True):
        y = x.sin()[index]
    return y + 1


def test_switches_are_restored_when_the_graph_raises_in_the_block():
    """The graph raises what eager raises (an index out of range); the effects after it, the switches'
    restoring among them, are eager's: the switches are as they were."""
    compiled = kiln.compile(indexes_in_cudnn_flags_block, backend="eager")
    x = torch.randn(4)
    assert_same(compiled(x, torch.tensor([1, 2])), indexes_in_cudnn_flags_block(x, torch.tensor([1, 2])))
    before = switch_state()
    with pytest.raises(IndexError, match="out of bounds"):
        compiled(x, torch.tensor([1, 9]))
    assert switch_state() == before


def branches_on_a_switch(x):
    return x * 2 if torch.backends.cudnn.enabled else x * 3


def test_a_switch_read_is_guarded():
    compiled = kiln.compile(branches_on_a_switch, backend="eager")
    x = torch.randn(3)
    assert_same(compiled(x), x * 2)
    try:
        torch.backends.cudnn.enabled = False
        assert_same(compiled(x), x * 3)
    finally:
        torch.backends.cudnn.enabled = True
    assert len(context_of(compiled).records) == 2


def in_cudnn_flags_block_after_a_global_change(x):
    with torch.backends.cudnn.flags(enabled=True):
        return x + 1, torch.backends.cudnn.enabled


def test_a_write_guards_the_switch_it_found():
    """A block that sets a switch to the value it already has changes nothing the graph's ops see; called when
    the switch has another value, the block changes it, and the compiled call must not reuse that graph."""
    compiled = kiln.compile(in_cudnn_flags_block_after_a_global_change, backend="eager")
    x = torch.randn(3)
    compiled(x)
    try:
        torch.backends.cudnn.enabled = False
        assert_same(compiled(x), (x + 1, True))
        assert torch.backends.cudnn.enabled is False
    finally:
        torch.backends.cudnn.enabled = True
    assert len(context_of(compiled).records) == 2


@contextlib.contextmanager
def mkldnn_off():
    old = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = old


def cpu_op_under_changed_mkldnn(x, w):
    y = x.sin()
    with mkldnn_off():
        y = torch.nn.functional.conv1d(y, w)
    return y.cos(), torch.backends.mkldnn.enabled


def test_an_op_a_changed_switch_governs_runs_under_the_switch_as_in_eager():
    """A graph runs under the switches as the call found them, so an op on a device whose switch the traced
    code changed (a CPU convolution with oneDNN off) is not put in it: it runs natively, as eager runs it."""
    x, w = torch.randn(1, 2, 8), torch.randn(3, 2, 3)
    before, breaks = switch_state(), fallbacks.breaks["backend_switch"]
    expected = cpu_op_under_changed_mkldnn(x, w)
    compiled = kiln.compile(cpu_op_under_changed_mkldnn, backend="eager")
    assert_same(expected, compiled(x, w))
    assert switch_state() == before
    assert fallbacks.breaks["backend_switch"] == breaks + 1


@contextlib.contextmanager
def deterministic_warning():
    old = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old[0], warn_only=old[1])


def sums_deterministically(x):
    y = x * 2
    with deterministic_warning():
        y = y.cumsum(0)
    return y + 1


@pytest.mark.parametrize("entry", [(False, False), (True, False)], ids=["off", "on"])
def test_deterministic_mode_set_in_a_block_is_restored_to_what_the_call_found(entry):
    """`torch.use_deterministic_algorithms` in a manager: the mode it restores is the one the call began with,
    read and guarded, not the one the first call found (which a graph node's result, kept as a constant,
    would restore)."""
    compiled = kiln.compile(sums_deterministically, backend="eager")
    x = torch.randn(4)
    compiled(x)
    try:
        torch.use_deterministic_algorithms(entry[0], warn_only=entry[1])
        before = switch_state()
        assert_same(compiled(x), sums_deterministically(x))
        assert switch_state() == before
    finally:
        torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def cudnn_tf32_off():
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = old


def reads_a_linked_switch(x):
    """cuDNN's TF32 flag sets the fp32 precision of cuDNN's convolutions: the precision read inside the block is
    the one the flag's write left, which torch decides."""
    with cudnn_tf32_off():
        precision = torch.backends.cudnn.conv.fp32_precision
        y = x + 1
    return y, precision, torch.backends.cudnn.conv.fp32_precision


def precision_state() -> tuple:
    return (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.rnn.fp32_precision, torch._C._get_fp32_precision_getter("cuda", "all"))


@pytest.mark.parametrize("fn, args", [(reads_a_linked_switch, ()), (in_cudnn_flags_block, ())],
                         ids=["linked read", "cudnn.flags"])
@pytest.mark.parametrize("tf32", [True, False], ids=["tf32", "no tf32"])
def test_linked_switches_read_what_eager_reads(fn, args, tf32):
    """A switch that is a view of another's state is not assumed unchanged by a write to the other: read after
    such a write, it is what torch says (the read runs natively), and the state after the call is eager's."""
    x = torch.randn(2, 3)
    old = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = tf32
        before = precision_state()
        expected = fn(x, *args)
        after_eager = precision_state()
        torch.backends.cudnn.allow_tf32 = tf32
        assert precision_state() == before
        assert_same(expected, kiln.compile(fn, backend="eager")(x, *args))
        assert precision_state() == after_eager
    finally:
        torch.backends.cudnn.allow_tf32 = old


def reads_switches_kiln_does_not_model(x):
    return x + 1, torch.backends.quantized.engine, torch.backends.miopen.immediate


def test_a_torch_backends_attribute_kiln_does_not_model_reads_as_a_constant():
    """Only the switches kiln models are traced through their module's descriptors; another one's C getter
    is not put in the graph."""
    x = torch.randn(3)
    ours, ops = graphs_of(kiln.compile, reads_switches_kiln_does_not_model, x)
    assert_same(reads_switches_kiln_does_not_model(x), ours)
    assert ops == [1]

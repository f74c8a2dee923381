"""`torch.compiler.is_compiling()` answers as it does under torch.compile, in every frame a compiled call runs.

It is True while a frame is traced (the graph holds the compiler's path) and False in code that runs eagerly.
Libraries pick paths by it: transformers builds a default attention mask only when not compiling
(`if mask is None and not is_torchdynamo_compiling(): mask = ones(...)`) and then reads `mask.shape` in a
callee. Traced, that raises; torch.compile then runs the frame eagerly (where the answer is False and the
mask is built) and compiles its callees. kiln must do the same: not keep the traced prefix (which left
the mask None) and run the raising call natively with it. Each test compares eager, kiln and torch.compile.
"""
import pytest
import torch
import torch._dynamo

import kiln
from kiln.api import context_of
from support.capture import CountingBackend, assert_same, graph_count


def outcome(fn, *args):
    """What a call returns, or the type of what it raises."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 (the exception is the outcome compared)
        return type(e)


def eager_kiln_torch(fn, *calls, with_torch: bool = True):
    """Outcomes of `calls` eagerly, through kiln and through torch.compile; kiln's and torch's graph counts."""
    eager = [outcome(fn, *args) for args in calls]
    ours = kiln.compile(fn, backend="eager")
    kiln_out = [outcome(ours, *args) for args in calls]
    if not with_torch:
        return eager, kiln_out, None, graph_count(context_of(ours)), None
    torch._dynamo.reset()
    counter = CountingBackend()
    theirs = torch.compile(fn, backend=counter)
    torch_out = [outcome(theirs, *args) for args in calls]
    torch._dynamo.reset()
    return eager, kiln_out, torch_out, graph_count(context_of(ours)), counter.graphs


def assert_outcomes(expected, actual):
    for e, a in zip(expected, actual):
        if isinstance(e, type):
            assert a is e
        else:
            assert_same(e, a)


def hf_is_compiling():
    """transformers' `is_torchdynamo_compiling`: a library function that asks torch."""
    return torch.compiler.is_compiling()


ASKS = {"torch.compiler": torch.compiler.is_compiling, "torch._dynamo": torch._dynamo.is_compiling,
        "library wrapper": hf_is_compiling}


def block_len(mask, n):
    return mask.shape[-1] // n


def blocks(mask, n):
    """Two calls deep, as transformers' `_get_local_attention_mask` -> `_split_into_blocks`."""
    return mask.reshape(mask.shape[0], block_len(mask, n), n)


def mask_in_root(x, ask, mask=None):
    if mask is None and not ask():
        mask = torch.ones(x.shape[0], 4)
    return x.sum(-1, keepdim=True) * mask.shape[-1]


def mask_in_callee(x, ask, mask=None):
    if mask is None and not ask():
        mask = torch.ones(x.shape[0], 4)
    return x[:, :1] + block_len(mask, 2)


def mask_two_calls_deep(x, ask, mask=None):
    y = x.cos()
    if mask is None and not ask():
        mask = torch.ones(x.shape[0], 4)
    return y.sum(-1).unsqueeze(-1) * blocks(mask, 2).sum((1, 2)).unsqueeze(-1)


def mask_in_a_function_with_a_block(x, ask, mask=None):
    """A `with` block in the frame: the frame runs eagerly all the same."""
    with torch.no_grad():
        y = x * 2
    if mask is None and not ask():
        mask = torch.ones(x.shape[0], 4)
    return y + block_len(mask, 2)


@pytest.mark.parametrize("ask", ASKS.values(), ids=ASKS.keys())
@pytest.mark.parametrize("program", [mask_in_root, mask_in_callee, mask_two_calls_deep,
                                     mask_in_a_function_with_a_block])
def test_a_default_built_only_when_not_compiling_is_built_as_eager_builds_it(program, ask):
    x = torch.randn(3, 4)
    # torch.compile (2.13) agrees with eager on the first spelling only: the other two are Python functions its
    # frame hook compiles when the frame around them runs eagerly, and they answer that frame True
    with_torch = ask is torch.compiler.is_compiling
    eager, ours, theirs, kiln_graphs, torch_graphs = eager_kiln_torch(lambda x: program(x, ask), (x,), (x + 1,),
                                                                      with_torch=with_torch)
    assert_outcomes(eager, ours)
    if with_torch:
        assert_outcomes(eager, theirs)
        assert kiln_graphs <= torch_graphs


def test_a_given_mask_still_compiles_after_a_call_without_one():
    """The frame run eagerly is cached for the inputs that raised when traced; a call with a mask passes
    other guards and is traced: one graph (torch.compile skips the frame for good: none)."""
    def fn(x, mask):
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones(x.shape[0], 4)
        return x * block_len(mask, 2)

    x, mask = torch.randn(3, 4), torch.ones(3, 4)
    eager, ours, theirs, kiln_graphs, torch_graphs = eager_kiln_torch(fn, (x, None), (x, mask), (x + 1, None))
    assert_outcomes(eager, ours)
    assert_outcomes(eager, theirs)
    assert (kiln_graphs, torch_graphs) == (1, 0)


def test_an_exception_eager_raises_too_is_raised():
    def fn(x, mask=None):
        y = x.relu()
        return y + block_len(mask, 2)

    eager, ours, theirs, _, _ = eager_kiln_torch(fn, (torch.randn(3, 4),))
    assert eager == ours == theirs == [AttributeError]


def test_side_effects_before_the_raise_happen_once():
    log = []

    def fn(x, mask=None):
        log.append(1)
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones(2, 4)
        return x + block_len(mask, 2)

    x = torch.randn(2)
    expected = fn(x)
    log.clear()
    assert_same(expected, kiln.compile(fn, backend="eager")(x))
    assert log == [1]


def answers(x):
    """What is_compiling() says here and in the frames around a graph break, packed into one number."""
    before = torch.compiler.is_compiling()
    torch._dynamo.graph_break()
    after = torch.compiler.is_compiling()
    return x + before + 10 * after + 100 * callee_answer() + 1000 * eager_answer()


def callee_answer():
    return torch.compiler.is_compiling()


@torch.compiler.disable
def eager_answer():
    return torch.compiler.is_compiling()


def test_is_compiling_around_a_graph_break_answers_as_torch_compile():
    """True in the graph before the break, in the continuation and in a callee traced into; False in a
    function torch.compiler.disable runs eagerly."""
    x = torch.zeros(1)
    eager, ours, theirs, kiln_graphs, torch_graphs = eager_kiln_torch(answers, (x,))
    assert_outcomes(eager, [x])
    assert_outcomes(theirs, ours)
    assert kiln_graphs <= torch_graphs


def none_checks(x, a, b):
    """Jumps on `is None` / `is not None` (3.11+ compiles them to POP_JUMP_IF_[NOT_]NONE) in a frame whose
    traced code raises for some inputs and not for others."""
    out = x
    if a is None:
        out = out + 1
    if b is not None:
        out = out * b
    if a is not None and b is None:
        out = out - 100
    return out + block_len(None if a is None else a, 2)


@pytest.mark.parametrize("a, b", [(None, None), (torch.ones(1, 4), None), (None, torch.full((1,), 3.0)),
                                  (torch.ones(1, 4), torch.full((1,), 3.0))], ids=["nn", "tn", "nt", "tt"])
def test_none_jumps_in_a_frame_whose_trace_raises_for_some_inputs(a, b):
    """Each call first raises AttributeError where `a` is None (eager too), so the frame runs eagerly for
    those inputs; the next calls, with the other None-ness, must not reuse its answers."""
    x = torch.randn(1)
    calls = [(x, None, b), (x, a, b), (x, None, None), (x, a, None)]
    eager, ours, theirs, _, _ = eager_kiln_torch(none_checks, *calls)
    assert_outcomes(eager, ours)
    assert_outcomes(eager, theirs)

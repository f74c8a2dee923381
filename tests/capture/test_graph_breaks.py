"""Graph breaks: what cannot be captured runs natively and the rest of the function continues
in a continuation; results are eager's, graph counts are as expected, and fullgraph=True
raises naming the reason and the user's file and line."""
import inspect
import sys

import numpy as np
import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import break_reasons, check, graph_count, t


def brk_print(x):
    y = x * 2
    print("value", y.shape)
    return y + 1


def brk_item(x):
    y = x.sum()
    s = y.item()
    return x * s


def brk_tolist(x):
    vals = (x * 2).tolist()
    return x + len(vals) + vals[0]


def brk_if_tensor(x):
    if x.sum() > 0:
        return x * 2
    return x - 2


def brk_while_tensor(x):
    n = 0
    while (x > 0).any() and n < 3:
        x = x - 1
        n += 1
    return x


def brk_numpy(x):
    a = np.ones(3) * 2
    return x * torch.from_numpy(a).float()


def brk_numpy_method(x):
    y = (x * 2).numpy()
    return torch.from_numpy(y * 3) + x


def brk_explicit(x):
    y = x.sin()
    kiln.graph_break()
    return y.cos()


@kiln.disable
def _eager_helper(x):
    return x * 10


def brk_disabled(x):
    y = x + 1
    z = _eager_helper(y)
    return z - 1


def _nested_with_print(x):
    y = x * 3
    print("nested", y.shape)
    return y + 1


def brk_in_nested_call(x):
    a = x.exp()
    b = _nested_with_print(a)
    return b * 2


def brk_in_loop(x):
    for i in range(3):
        x = x + i
        print(i)
    return x


def brk_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print(y.shape)
        z = y + 1
    return z, z.requires_grad, x * 3


def brk_unknown_c_function(x):
    import zlib

    n = zlib.crc32(b"kiln") % 7
    return x * n


def brk_int_of_tensor(x):
    n = int(x.sum())
    return x + n


def brk_float_of_tensor(x):
    return x * float(x.max())


def brk_assert_tensor(x):
    assert torch.all(x.abs() >= 0)
    return x.abs().sqrt()


def brk_two_breaks(x):
    x = x + 1
    print("a")
    x = x * 2
    print("b")
    return x - 1


def brk_keeps_locals(x):
    a = x * 2
    b = [a, 3]
    c = {"k": a + 1}
    print("mid")
    return a + b[0] * b[1] + c["k"]


def brk_in_comprehension_callee(xs):
    return [x.item() * 2 for x in xs]


def brk_then_return_python(x):
    v = x.sum().item()
    return {"v": round(v, 3), "t": x * 2}


def brk_backward(x):
    y = (x * x).sum()
    y.backward()
    return x.grad * 2


def brk_nonzero(x):
    idx = torch.nonzero(x > 0)
    return idx.shape[0] + x


def brk_generator_object(x):
    def gen():
        yield x * 2
        yield x * 3

    g = gen()
    return next(g) + next(g)


BREAKS = [
    # (fn, args, expected graph count, expected first break reason)
    (brk_print, (t(3, grad=True),), 2, "print"),
    (brk_item, (t(3),), 2, "tensor_to_python"),
    (brk_tolist, (t(3),), 2, "tensor_to_python"),
    (brk_if_tensor, (t(3),), 2, "data_dependent_branch"),
    (brk_numpy, (t(3),), 1, "numpy"),
    (brk_numpy_method, (t(3),), 2, "numpy"),
    (brk_explicit, (t(3, grad=True),), 2, "explicit"),
    (brk_disabled, (t(3, grad=True),), 2, "disabled"),
    (brk_in_nested_call, (t(3, grad=True),), None, "print"),
    (brk_in_loop, (t(3),), None, "print"),
    (brk_in_no_grad, (t(3, grad=True),), None, "print"),
    (brk_unknown_c_function, (t(3),), 1, "unsupported_call"),
    (brk_int_of_tensor, (t(3),), 2, "tensor_to_python"),
    (brk_float_of_tensor, (t(3),), 2, "tensor_to_python"),
    (brk_assert_tensor, (t(3).abs(),), 2, "data_dependent_branch"),
    (brk_two_breaks, (t(3, grad=True),), 3, "print"),
    (brk_keeps_locals, (t(3, grad=True),), 2, "print"),
    (brk_in_comprehension_callee, ([t(()), t(())],), None, "tensor_to_python"),
    (brk_then_return_python, (t(3),), 2, "tensor_to_python"),
]


def break_cases() -> list:
    """BREAKS as parameters; a numpy break is a fallback (torch.compile traces numpy), exercised on purpose."""
    numpy = pytest.mark.allows_fallback("graph_break: numpy")
    return [pytest.param(*b, id=b[0].__name__, marks=[numpy] if b[3] == "numpy" else []) for b in BREAKS]


@pytest.mark.parametrize("fn,args,graphs,reason", break_cases())
def test_break_matches_eager(fn, args, graphs, reason, capsys):
    # a value read into Python (.item()) is a constant of the continuation: new values recompile it
    # a branch on fresh values may take the other path (a new continuation)
    ctx = check(fn, *args, graphs=graphs, second=reason not in ("tensor_to_python", "data_dependent_branch"))
    if fn is brk_in_comprehension_callee and sys.version_info >= (3, 12):
        # Python 3.12 inlines the comprehension (PEP 709): its break is inside the frame's own loop, so the
        # frame is stepped natively with its calls compiled, and the records name the values it reads natively
        return
    assert reason in break_reasons(ctx), break_reasons(ctx)


# `x * y.item()` is one graph under fullgraph=True, as torch.compile makes it (values/items.py)
FULLGRAPH_BREAKS = [b for b in BREAKS if b[0] is not brk_item]


@pytest.mark.parametrize("fn,args,graphs,reason", FULLGRAPH_BREAKS, ids=[b[0].__name__ for b in FULLGRAPH_BREAKS])
def test_fullgraph_raises_naming_reason_and_line(fn, args, graphs, reason, capsys):
    c = kiln.compile(fn, backend="eager", fullgraph=True)
    with pytest.raises(kiln.FullGraphError) as info:
        c(*args)
    message = str(info.value)
    assert f"({reason})" in message, message
    assert __file__ in message, message
    lines, start = inspect.getsourcelines(fn)
    # the user's own line is named even when the break is deeper (a callee, a library function)
    assert any(f"{__file__}:{n} in {fn.__name__}" in message for n in range(start, start + len(lines))), message


def test_print_output_and_order(capsys):
    c = kiln.compile(brk_two_breaks, backend="eager")
    c(t(2))
    assert capsys.readouterr().out == "a\nb\n"


def test_breaks_in_loop_print_each_iteration(capsys):
    c = kiln.compile(brk_in_loop, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), brk_in_loop(x))
    assert capsys.readouterr().out == "0\n1\n2\n" * 2


def test_break_in_nested_call_compiles_callee():
    c = kiln.compile(brk_in_nested_call, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), brk_in_nested_call(x))
    frames = [r.frame for r in context_of(c).records]
    assert any("_nested_with_print" in f for f in frames), frames
    assert graph_count(context_of(c)) >= 3


def test_no_grad_restored_after_break():
    c = kiln.compile(brk_in_no_grad, backend="eager")
    x = t(3, grad=True)
    z, flag, w = c(x)
    assert flag is False and not z.requires_grad and w.requires_grad
    assert torch.is_grad_enabled()


def test_side_effects_before_break_happen_once_in_order(capsys):
    log = []

    def fn(x):
        log.append("before")
        y = x * 2
        print("break")
        log.append("after")
        return y

    c = kiln.compile(fn, backend="eager")
    c(t(2))
    assert log == ["before", "after"]
    c(t(2))
    assert log == ["before", "after"] * 2
    assert capsys.readouterr().out == "break\n" * 2


def test_backward_inside_breaks_and_matches():
    c = kiln.compile(brk_backward, backend="eager")
    x1, x2 = t(3, grad=True), None
    x2 = x1.detach().clone().requires_grad_()
    torch.testing.assert_close(c(x1), brk_backward(x2))
    assert "autograd_backward" in break_reasons(context_of(c))


def test_generator_object_matches_eager():
    check(brk_generator_object, t(3))


def test_explain_like_counts_for_two_breaks(capsys):
    c = kiln.compile(brk_two_breaks, backend="eager")
    c(t(3))
    ctx = context_of(c)
    assert graph_count(ctx) == 3
    assert break_reasons(ctx) == ["print", "print"]
    for r in ctx.records:
        if r.graph_break is not None:
            assert r.graph_break.location.filename == __file__
            assert "print(" in r.graph_break.location.line_text()


def test_continuation_cached_across_calls(capsys):
    c = kiln.compile(brk_print, backend="eager")
    for _ in range(4):
        c(t(3))
    assert len(context_of(c).records) == 2


def test_data_dependent_branch_takes_both_paths():
    c = kiln.compile(brk_if_tensor, backend="eager")
    pos, neg = torch.ones(3), -torch.ones(3)
    torch.testing.assert_close(c(pos), pos * 2)
    torch.testing.assert_close(c(neg), neg - 2)
    torch.testing.assert_close(c(pos), pos * 2)
    assert len(context_of(c).records) == 3  # the entry and one continuation per branch


def test_break_inside_try_runs_correctly():
    def fn(x):
        try:
            y = x * 2
            print("in try")
            z = y + 1
        except RuntimeError:
            z = x
        return z

    check(fn, t(3))


def test_exception_raised_by_user_code_propagates():
    def fn(x):
        if x.shape[0] == 3:
            raise ValueError("three")
        return x

    c = kiln.compile(fn, backend="eager")
    with pytest.raises(ValueError, match="three"):
        c(t(3))
    torch.testing.assert_close(c(t(2) * 0), torch.zeros(2))


def test_exception_caught_in_user_code():
    def fn(x):
        try:
            raise KeyError("k")
        except KeyError:
            return x + 1

    check(fn, t(3))


def test_with_unknown_context_manager_runs_correctly():
    import contextlib

    events = []

    @contextlib.contextmanager
    def ctx():
        events.append("enter")
        yield
        events.append("exit")

    def fn(x):
        with ctx():
            y = x * 2
        return y + 1

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), fn(x))
    assert events == ["enter", "exit", "enter", "exit"]


def test_class_statement_inside_function():
    def fn(x):
        class Local:
            k = 3
        return x * Local.k

    check(fn, t(3))


def test_nonzero_size_stays_in_the_graph():
    c = kiln.compile(brk_nonzero, backend="eager")
    for _ in range(4):
        x = t(6)
        torch.testing.assert_close(c(x), brk_nonzero(x))


def test_item_values_make_the_continuation_dynamic(monkeypatch):
    """The continuation specializes on the first .item() value; the second makes it a graph input (automatic
    dynamic), and every later value reuses that entry."""
    c = kiln.compile(brk_item, backend="eager")
    for _ in range(6):
        x = t(3)
        torch.testing.assert_close(c(x), brk_item(x))
    assert len(context_of(c).records) == 3  # the entry, the specialized continuation, the dynamic one


def brk_item_as_count(x):
    n = x.sum().item()
    for _ in range(abs(n) % 5 + 1):  # n read as a Python value (a trip count): specialized per value
        x = x * 2
    return x


def test_item_values_read_as_python_values_recompile_and_stay_correct(monkeypatch):
    """Each new value specializes the continuation; past the cache limit it still runs right (natively)."""
    monkeypatch.setattr(kiln.config, "cache_size_limit", 3)
    c = kiln.compile(brk_item_as_count, backend="eager")
    inputs = [torch.tensor([k, 0, 0]) for k in range(6)]  # counts 1 .. 5, then 1 again
    for x in inputs:
        torch.testing.assert_close(c(x), brk_item_as_count(x))
    frame = next(f for spec, f in context_of(c).frames.items() if spec.start)
    assert len(frame.entries) >= 3  # the limit's worth of specialized continuations, then native steps


def test_break_before_a_try_block_runs_correctly(capsys):
    """The continuation would break inside the try: the frame runs natively instead of crashing."""
    def fn(x):
        y = x * 2
        print("a")
        try:
            z = y + 1
            print("b")
        except KeyError:
            z = y
        return z

    check(fn, t(3))

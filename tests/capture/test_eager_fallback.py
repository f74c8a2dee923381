"""When capture cannot work at all, the user's program still runs: eagerly, with one warning;
disabled functions and methods run natively inside compiled code."""
import warnings

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.api import context_of
from support.capture import break_reasons, check, t


@pytest.mark.allows_fallback('frame: capture is broken on purpose')
def test_internal_capture_failure_warns_once_and_runs_eagerly(monkeypatch):
    import kiln.capture.entry as entry

    def broken(*args, **kwargs):
        raise RuntimeError("internal capture bug")

    monkeypatch.setattr(entry, "capture", broken)

    def fn(x):
        return x * 2

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(c(x), x * 2)
    msgs = [str(w.message) for w in caught if "internal capture bug" in str(w.message)]
    assert len(msgs) == 1, msgs


class WithDisabledMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.calls = 0

    @kiln.disable
    def helper(self, x):
        self.calls += 1
        return x * 10

    def forward(self, x):
        return self.helper(self.fc(x)) + 1


def test_disabled_method_runs_natively():
    torch.manual_seed(0)
    m = WithDisabledMethod()
    c = kiln.compile(m, backend="eager")
    x = t(2, 3)
    torch.testing.assert_close(c(x), m.fc(x) * 10 + 1)
    assert m.calls == 1
    assert "disabled" in break_reasons(context_of(c))


def test_disable_inside_compiled_nested_call():
    @kiln.disable
    def eager_only(x):
        assert not torch.compiler.is_compiling()
        return x.sum().item()

    def fn(x):
        return x * eager_only(x)

    check(fn, t(3), second=False)


def test_generator_function_consumed_by_user_loop():
    def gen(x):
        for i in range(3):
            yield x * i

    def fn(x):
        total = 0
        for v in gen(x):
            total = total + v
        return total

    check(fn, t(3, grad=True), graphs=1, fullgraph=True)


def test_yield_from_generator():
    def inner(x):
        yield x
        yield x * 2

    def outer(x):
        yield from inner(x)
        yield x * 3

    def fn(x):
        return torch.stack(list(outer(x)))

    check(fn, t(3), graphs=1, fullgraph=True)


def test_module_parameters_and_buffers_iteration():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.register_buffer("b", torch.ones(3))

        def forward(self, x):
            reg = sum(p.pow(2).sum() for p in self.parameters())
            nb = len(list(self.buffers()))
            return self.fc(x) + reg + nb

    from support.capture import check_module

    check_module(M, t(2, 3, grad=True), graphs=1, fullgraph=True)


@pytest.mark.allows_fallback("frame: kiln runs a generator function's frame natively (unresumable yield)")
def test_compiling_a_generator_function_yields_like_eager():
    def gen(x):
        for i in range(3):
            yield x * i

    c = kiln.compile(gen, backend="eager")
    x = t(3)
    got = list(c(x))
    want = list(gen(x))
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_break_with_varargs_and_kwargs_at_entry(capsys):
    def fn(*args, **kwargs):
        y = args[0] * kwargs["k"]
        print("mid")
        return y + len(args) + len(kwargs)

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x, 1, k=2.0), fn(x, 1, k=2.0))


def test_user_list_mutated_then_printed(capsys):
    def fn(xs, x):
        xs.append(1)
        print(len(xs))
        xs.append(2)
        return x * len(xs)

    c = kiln.compile(fn, backend="eager")
    xs = []
    x = t(3)
    torch.testing.assert_close(c(xs, x), x * 2)
    assert xs == [1, 2]
    assert capsys.readouterr().out == "1\n"


def test_inplace_input_then_print_sees_new_value(capsys):
    def fn(x):
        x.add_(1)
        print(float(x.sum()))
        return x

    c = kiln.compile(fn, backend="eager")
    x = torch.zeros(3)
    c(x)
    assert capsys.readouterr().out == "3.0\n"


@pytest.mark.allows_fallback("frame: a continuation's capture is broken on purpose")
def test_continuation_capture_failure_steps_natively(monkeypatch, capsys):
    """An internal failure while capturing a continuation must not break the program."""
    import kiln.capture.entry as entry

    real = entry.capture
    calls = []

    def flaky(spec, *args, **kwargs):
        opaque = args[4] if len(args) > 4 else kwargs.get("opaque", False)
        if spec.start != 0 and not opaque and not calls:
            calls.append(spec)
            raise RuntimeError("internal bug in a continuation")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(entry, "capture", flaky)

    def fn(x):
        y = x * 2
        print("break")
        return y + 1

    c = kiln.compile(fn, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), x * 2 + 1)
    torch.testing.assert_close(c(x), x * 2 + 1)
    assert calls

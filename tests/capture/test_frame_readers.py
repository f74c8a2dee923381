"""Builtins that read the calling frame, run natively after a graph break (found by CPython's test_collections,
`eval(repr(d))`): `globals()`, and `eval(s)`/`exec(s)` without a namespace, see the user's module globals, not
the output program's namespace (a NameError, or a name of kiln's own). `locals()` and `vars()` are the traced
frame's variables (cells and free variables too), and `eval(s)`/`exec(s)` see them (CPython's test_set
`TestSubsets.test_issubset`: `eval("x < y", locals())` read the output program's locals), and so is `dir()`;
`vars(obj)` runs a `__dict__` property the class defines (CPython's test_builtin test_vars). Each case
compares with eager.
"""
from __future__ import annotations

from collections import ChainMap

import pytest
import torch

import kiln

SCALE = 3.0


def reads_module_globals(x):
    chained = ChainMap({"a": 1})
    again = eval(repr(chained))  # ChainMap is a global of this module
    scale = eval("SCALE")
    namespace = {}
    exec("doubled = SCALE * 2", globals(), namespace)
    return x * scale, again == chained, namespace["doubled"], "SCALE" in globals()


@pytest.mark.allows_fallback("graph_break: eval, exec and globals() run natively")
def test_eval_exec_and_globals_see_the_users_module():
    x = torch.randn(3)
    expected = reads_module_globals(x)
    actual = kiln.compile(reads_module_globals, backend="eager")(x)
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1:] == expected[1:]


def reads_frame_locals(x):
    y = x * 2
    factor = 3

    def scaled():
        return y * factor

    results = []
    for op in ("<", "==", "!="):
        results.append(eval("factor" + op + "4", {}, locals()))
    copied = dict(vars())
    namespace = {}
    exec("namespace['z'] = factor + 1")
    return eval("y + factor"), sorted(locals()), sorted(copied), results, scaled(), namespace["z"]


def locals_before_a_cell_is_assigned(x):
    before = sorted(locals())
    late = x + 1

    def uses_late():
        return late

    return before, sorted(locals()), uses_late()


class DictProperty:
    """A class whose `__dict__` is a property: vars() answers what the property gives."""

    def _fake_dict(self):
        return {"a": 2}

    __dict__ = property(_fake_dict)


EXISTING = DictProperty()


def dir_and_vars(x):
    names = dir()
    return x + 1, names, set(vars()) == set(dir()), vars(DictProperty()), vars(EXISTING)


@pytest.mark.allows_fallback("graph_break: eval and exec run natively")
@pytest.mark.parametrize("fn", [reads_frame_locals, locals_before_a_cell_is_assigned, dir_and_vars])
def test_locals_vars_and_eval_see_the_frames_variables(fn):
    for _ in range(2):
        x = torch.randn(3)
        expected = fn(x)
        actual = kiln.compile(fn, backend="eager")(x)
        assert repr(actual) == repr(expected)


def hooks_a_lazily_negated_input(a, c):
    t = torch.sign(c)  # a lazily negated tensor is not modelled: a graph break
    if c.requires_grad and c.is_leaf:
        c.register_hook(lambda g: g.clamp(-1, 1))  # a break at a call of its method, resumed after the call
    return t * a + c * 4


def lazily_negated_leaf(seed: int) -> torch.Tensor:
    """A leaf that requires grad, its memory holding its values negated (as `z.conj().imag`'s does)."""
    return (-torch.randn(3, generator=torch.Generator().manual_seed(seed)))._neg_view().requires_grad_()


def test_a_break_at_a_call_of_an_object_kiln_does_not_model_resumes_after_it():
    """Writing the program of a break asks whether the breaking call is `eval(s)`/`exec(s)`, which read the frame.
    Asking wrapped the callee, and wrapping a bound method of a lazily negated tensor breaks the graph, which
    there it cannot: the whole continuation ran natively, a frame fallback (the fuzzer's seed 861365). The
    callee is now told by identity, guarded; the break resumes after the call, the hook in place."""
    compiled = kiln.compile(hooks_a_lazily_negated_input)
    for seed in range(2):
        a = torch.randn(3)
        c_eager, c_kiln = lazily_negated_leaf(seed), lazily_negated_leaf(seed)
        expected, actual = hooks_a_lazily_negated_input(a, c_eager), compiled(a, c_kiln)
        torch.testing.assert_close(actual, expected)
        (expected * 10).sum().backward()
        (actual * 10).sum().backward()
        torch.testing.assert_close(c_kiln.grad, c_eager.grad)  # clamped to [-1, 1] by the hook, as in eager
        assert c_kiln.grad.abs().max() <= 1


def call_at_a_break(f, c, s):
    t = torch.sign(c) * 2  # a break: c is lazily negated
    return f(s), t


def test_the_callee_told_apart_without_wrapping_it_is_guarded():
    """A continuation written for a callee that reads no frame (a method of a lazily negated tensor) is not run for
    `eval`: the identity the program was written for is guarded, and `eval(s)` sees the frame's `t`."""
    compiled = kiln.compile(call_at_a_break)
    c = lazily_negated_leaf(0).detach()
    for f, s in ((c.mul, 2.0), (eval, "t.sum()"), (c.mul, 3.0)):
        expected, actual = call_at_a_break(f, c, s), compiled(f, c, s)
        torch.testing.assert_close(actual, expected)

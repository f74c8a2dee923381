"""The public API: kiln.compile's forms and arguments, OptimizedModule, disable, backends."""
import functools

import pytest
import torch
import torch._dynamo
import torch.nn as nn

import kiln
from kiln.api import context_of
from kiln.capture.entry import BackendCompilerFailed
from support.capture import graph_count, t


def double(x):
    return x * 2


def test_call_form():
    c = kiln.compile(double, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), x * 2)
    assert c.__name__ == "double"


def test_decorator_without_arguments():
    @kiln.compile
    def f(x):
        return x + 1

    x = t(3)
    torch.testing.assert_close(f(x), x + 1)


def test_decorator_with_arguments():
    @kiln.compile(backend="eager", fullgraph=True)
    def f(x):
        return x - 1

    x = t(3)
    torch.testing.assert_close(f(x), x - 1)
    assert context_of(f).fullgraph


def test_bound_method():
    class Obj:
        def __init__(self):
            self.k = 3.0

        def run(self, x):
            return x * self.k

    o = Obj()
    c = kiln.compile(o.run, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), x * 3.0)
    o.k = 4.0
    torch.testing.assert_close(c(x), x * 4.0)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def test_optimized_module_shares_state():
    m = _model()
    c = kiln.compile(m, backend="eager")
    assert isinstance(c, nn.Module)
    assert c._orig_mod is m
    assert [p is q for p, q in zip(c.parameters(), m.parameters())] == [True] * 4
    assert list(c.state_dict()) == list(m.state_dict())
    x = t(2, 3)
    torch.testing.assert_close(c(x), m(x))
    assert getattr(c, "0") is m[0]  # attribute pass-through (as torch.compile, no __getitem__)
    assert c.training and m.training


def test_optimized_module_train_eval_to():
    m = _model()
    c = kiln.compile(m, backend="eager")
    c.eval()
    assert not m.training
    c.train()
    assert m.training
    c.to(torch.float64)
    assert m[0].weight.dtype == torch.float64
    x = t(2, 3, dtype=torch.float64)
    torch.testing.assert_close(c(x), m(x))


def test_optimized_module_load_state_dict_and_grad():
    m = _model()
    c = kiln.compile(m, backend="eager")
    sd = {k: torch.zeros_like(v) for k, v in m.state_dict().items()}
    c.load_state_dict(sd)
    assert torch.count_nonzero(m[0].weight) == 0
    x = t(2, 3)
    c(x).sum().backward()
    assert m[2].bias.grad is not None


def test_optimized_module_attribute_setting_passes_through():
    m = _model()
    m.flag = 1
    c = kiln.compile(m, backend="eager")
    assert c.flag == 1
    c.flag = 2
    assert m.flag == 2


def test_disable_true_returns_the_callable():
    m = _model()
    assert kiln.compile(m, disable=True) is m
    assert kiln.compile(double, disable=True) is double


def test_kiln_disable_decorator_runs_eagerly():
    @kiln.disable
    def f(x):
        return x * 3

    x = t(3)
    torch.testing.assert_close(f(x), x * 3)
    assert f.__name__ == "f"


@pytest.mark.parametrize("kwargs,exc,needle", [
    ({"backend": "nope"}, ValueError, "backend"),
    ({"backend": 3}, TypeError, "backend"),
    ({"mode": "warp-speed"}, ValueError, "mode"),
    ({"mode": 7}, TypeError, "mode"),
    ({"options": {"no.such.option": 1}}, ValueError, "no.such.option"),
    ({"options": [1]}, TypeError, "options"),
    ({"fullgraph": "yes"}, TypeError, "fullgraph"),
    ({"dynamic": "maybe"}, TypeError, "dynamic"),
    ({"disable": 1}, TypeError, "disable"),
], ids=["backend", "backend_type", "mode", "mode_type", "option", "options_type", "fullgraph", "dynamic", "disable"])
def test_bad_arguments_raise_clearly(kwargs, exc, needle):
    with pytest.raises(exc, match=needle):
        kiln.compile(double, **kwargs)


def test_non_callable_model_raises():
    with pytest.raises(TypeError, match="expected a function"):
        kiln.compile(42)


def test_unknown_backend_lists_known_ones():
    with pytest.raises(ValueError) as info:
        kiln.compile(double, backend="nope")
    assert "eager" in str(info.value)


def test_user_callable_backend_receives_graph_and_example_inputs():
    seen = []

    def my_backend(gm, example_inputs):
        assert isinstance(gm, torch.fx.GraphModule)
        seen.append((gm, list(example_inputs)))
        return gm.forward

    c = kiln.compile(double, backend=my_backend)
    x = t(3)
    torch.testing.assert_close(c(x), x * 2)
    assert len(seen) == 1
    gm, inputs = seen[0]
    assert len(inputs) == 1 and inputs[0].shape == (3,)
    assert any(n.op == "call_function" for n in gm.graph.nodes)


def test_backend_returning_other_callable_is_used():
    def negating(gm, example_inputs):
        def run(*args):
            return tuple(-o for o in gm(*args))
        return run

    c = kiln.compile(double, backend=negating)
    x = t(3)
    torch.testing.assert_close(c(x), -(x * 2))


def test_backend_failure_raises_backend_compiler_failed():
    def broken(gm, example_inputs):
        raise RuntimeError("kaput")

    c = kiln.compile(double, backend=broken)
    with pytest.raises(kiln.BackendCompilerFailed, match="kaput"):
        c(t(3))


def test_register_and_list_backends():
    @kiln.register_backend
    def capture_test_backend(gm, example_inputs):
        return gm.forward

    assert "capture_test_backend" in kiln.list_backends()
    assert "eager" in kiln.list_backends() and "inductor" in kiln.list_backends()
    c = kiln.compile(double, backend="capture_test_backend")
    x = t(3)
    torch.testing.assert_close(c(x), x * 2)

    kiln.register_backend(name="capture_named_backend")(lambda gm, ex: gm.forward)
    assert "capture_named_backend" in kiln.list_backends()


def _backend_calls(compile_, **options):
    """The keyword arguments each compiler passes a user's backend for `options` (torch.compile's contract)."""
    seen = []

    def backend(gm, example_inputs, **kwargs):
        seen.append(kwargs)
        return gm.forward

    torch._dynamo.reset()
    x = t(3)
    torch.testing.assert_close(compile_(double, backend=backend, **options)(x), x * 2)
    return seen


@pytest.mark.parametrize("options", [dict(mode="default"), dict(mode=None), dict(mode="max-autotune"),
                                     dict(options={"some.flag": True})],
                         ids=["default", "none", "max_autotune", "options"])
def test_mode_and_options_with_a_callable_backend_as_torch_compile(options):
    """mode="default" names no options and is dropped; any other mode, and options, reach the backend as
    keyword arguments."""
    assert _backend_calls(kiln.compile, **options) == _backend_calls(torch.compile, **options)


def test_callable_backend_without_keyword_arguments_raises_for_a_mode():
    """As under torch.compile, the backend's TypeError surfaces on the first call (wrapped, naming the backend)."""
    compiled = kiln.compile(double, backend=lambda gm, ex: gm.forward, mode="max-autotune")
    with pytest.raises(BackendCompilerFailed, match="mode"):
        compiled(t(3))


def scale_shift(x, scale, shift=0.0):
    return x * scale + shift


@pytest.mark.parametrize("bound", [
    functools.partial(scale_shift, scale=3.0),
    functools.partial(scale_shift, shift=1.0, scale=2.0),
    functools.partial(functools.partial(scale_shift, scale=2.0), shift=-1.0),
], ids=["keyword", "keywords", "nested"])
def test_partial_objects_compile(bound):
    compiled = kiln.compile(bound, backend="eager", fullgraph=True)
    x = t(3)
    torch.testing.assert_close(compiled(x), bound(x))
    torch.testing.assert_close(compiled(x, shift=5.0), bound(x, shift=5.0))  # a call's keyword overrides a bound one
    assert graph_count(context_of(compiled)) == 2  # fullgraph: one graph per call, the new constant recompiles


def test_partial_with_a_bound_tensor_and_a_module():
    weight = t(3)
    compiled = kiln.compile(functools.partial(scale_shift, shift=weight), backend="eager", fullgraph=True)
    x = t(3)
    torch.testing.assert_close(compiled(x, 2.0), x * 2.0 + weight)
    weight.add_(1.0)  # a tensor bound in the partial is an input: its new value is read
    torch.testing.assert_close(compiled(x, 2.0), x * 2.0 + weight)
    linear = torch.nn.Linear(3, 2)
    compiled_module = kiln.compile(functools.partial(linear), backend="eager")
    torch.testing.assert_close(compiled_module(x), linear(x))


def test_config_cache_size_limit_default():
    assert kiln.config.cache_size_limit == 8


def test_kwargs_and_defaults_at_entry():
    def f(x, scale=2.0, *, shift=0.0):
        return x * scale + shift

    c = kiln.compile(f, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), f(x))
    torch.testing.assert_close(c(x, 3.0), f(x, 3.0))
    torch.testing.assert_close(c(x, shift=1.0), f(x, shift=1.0))
    torch.testing.assert_close(c(scale=0.5, x=x), f(x, 0.5))


def test_positional_calls_leaving_defaults_out_bind_as_python_does():
    def f(x, scale=2.0, shift=None):
        return x * scale if shift is None else x * scale + shift

    c = kiln.compile(f, backend="eager")
    x = t(3)
    torch.testing.assert_close(c(x), f(x))
    torch.testing.assert_close(c(x, 3.0), f(x, 3.0))
    torch.testing.assert_close(c(x, 3.0, x), f(x, 3.0, x))
    f.__defaults__ = (5.0, None)  # read per call, as Python reads it
    torch.testing.assert_close(c(x), x * 5.0)


@pytest.mark.parametrize("args,kwargs", [((), {}), ((1, 2, 3), {}), ((1,), {"q": 1}), ((1,), {"x": 1})])
def test_a_call_python_cannot_bind_raises_pythons_own_error(args, kwargs):
    def f(x, scale=2.0):
        return x * scale

    with pytest.raises(TypeError) as eager:
        f(*args, **kwargs)
    with pytest.raises(TypeError) as got:
        kiln.compile(f, backend="eager")(*args, **kwargs)
    assert str(got.value) == str(eager.value)


def test_graph_break_outside_compiled_is_a_noop():
    assert kiln.graph_break() is None


def test_is_compiling_true_only_while_capturing():
    def f(x):
        if torch.compiler.is_compiling():
            return x + 1
        return x - 1

    c = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(3)
    torch.testing.assert_close(c(x), x + 1)
    torch.testing.assert_close(f(x), x - 1)


def test_compiled_module_inside_compiled_function():
    m = _model()
    cm = kiln.compile(m, backend="eager")

    def f(x):
        return cm(x) * 2

    c = kiln.compile(f, backend="eager")
    x = t(2, 3)
    torch.testing.assert_close(c(x), m(x) * 2)


def test_records_expose_graph_guards_and_program():
    c = kiln.compile(double, backend="eager")
    c(t(3))
    (rec,) = context_of(c).records
    assert rec.graph is not None and rec.op_count == 1 and rec.graph_break is None
    assert "def program(L, G, C)" in rec.program_source and "def guard(L, G, C)" in rec.program_source
    assert len(rec.guards.guards) >= 2


def test_context_of_rejects_uncompiled():
    with pytest.raises(TypeError):
        context_of(double)

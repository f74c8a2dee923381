"""Tensor guards checked in C++ (kiln/capture/tensor_checks.py): one call checks every tensor a cache entry
specialized on, parameters and buffers included, and decides exactly as the Python checks do."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.api import context_of
from kiln.capture import tensor_checks


@pytest.fixture(params=["c++", "python"])
def checks(request, monkeypatch):
    """Run a test with the C++ tensor checks, then with the Python ones (no compiler: the fallback)."""
    if request.param == "c++":
        if tensor_checks.wait() is None:
            pytest.skip("the C++ tensor checks cannot be built here")
    else:
        monkeypatch.setattr(tensor_checks, "available", lambda: None)
    return request.param


def _entry(compiled):
    (frame,) = context_of(compiled).frames.values()
    return frame.entries[-1]


def _checks_in_cpp(compiled) -> bool:
    return "___check_tensors" in _entry(compiled).guard.__code__.co_names


def test_the_guard_checks_all_parameters_and_inputs_in_one_call(checks):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x))
    assert _checks_in_cpp(compiled) == (checks == "c++")
    if checks == "c++":
        source = _entry(compiled).guards.source_code(native=True)
        assert "___check_tensors(___tensor_specs, " in source and "# tensor: 5 tensors" in source, source


# what a user does to a parameter in place, keeping the same Parameter object
PARAMETER_CHANGES = {
    "shape": lambda m: setattr(m.weight, "data", torch.randn(3, 5)),
    "strides": lambda m: setattr(m.weight, "data", torch.randn(4, 3).t()),
    "dtype": lambda m: m.double(),
    "requires_grad": lambda m: m.weight.requires_grad_(False),
}


@pytest.mark.parametrize("change", PARAMETER_CHANGES)
def test_a_parameter_changed_in_place_recompiles(checks, change):
    model = nn.Linear(4, 3)
    compiled = kiln.compile(lambda x: model(x).sum(1), backend="eager")
    x = torch.randn(2, 4)
    compiled(x)
    PARAMETER_CHANGES[change](model)
    if change == "shape":
        model.in_features, x = 5, torch.randn(2, 5)
    x = x.to(model.weight.dtype)
    torch.testing.assert_close(compiled(x), model(x).sum(1))
    assert len(context_of(compiled).records) == 2
    torch.testing.assert_close(compiled(x), model(x).sum(1))
    assert len(context_of(compiled).records) == 2


def test_a_non_contiguous_input_where_a_contiguous_one_was_compiled_recompiles(checks):
    compiled = kiln.compile(lambda x: x * 2, backend="eager")
    x = torch.randn(4, 6)
    compiled(x)
    y = torch.randn(6, 4).t()
    torch.testing.assert_close(compiled(y), y * 2)
    assert len(context_of(compiled).records) == 2


def lazily_negated(x):
    """`z.conj().imag`: a view whose memory holds the negated values (its negation bit set)."""
    return torch.view_as_complex(torch.stack([torch.zeros_like(x), -x], -1)).conj().imag


def test_a_lazily_negated_input_runs_with_its_values(checks):
    """A kernel reads a tensor's memory as it lies: a negated view (`z.conj().imag`) passed in would be read with
    the wrong sign (torch.compile reads it so). Its frame runs natively, and a graph compiled for a plain tensor
    never takes one (its guard checks the bit), first call or later."""
    f = lambda x: x * 2 + 1  # noqa: E731
    x = torch.randn(5)
    later = kiln.compile(f)
    torch.testing.assert_close(later(x.clone()), f(x))
    assert lazily_negated(x).is_neg()
    breaks = kiln.fallbacks.breaks.get("unsupported_object", 0)
    torch.testing.assert_close(later(lazily_negated(x)), x * 2 + 1)
    assert kiln.fallbacks.breaks["unsupported_object"] == breaks + 1  # the plain tensor's graph was not run on it
    first = kiln.compile(f)
    torch.testing.assert_close(first(lazily_negated(x)), x * 2 + 1)
    torch.testing.assert_close(first(x.clone()), f(x))


def test_a_tensor_subclass_is_checked_in_python():
    """A subclass may compute its properties in Python (`__torch_function__`): the C++ check reads none of it."""
    class Tagged(torch.Tensor):
        pass

    compiled = kiln.compile(lambda x, y: x + y, backend="eager")
    x, y = torch.randn(3).as_subclass(Tagged), torch.randn(3)
    compiled(x, y)
    guards = _entry(compiled).guards.guards
    assert [g.native is None for g in guards if g.kind.value == "tensor"] == [True, False]


def test_the_check_compares_each_property():
    module = tensor_checks.wait()
    if module is None:
        pytest.skip("the C++ tensor checks cannot be built here")
    p = nn.Parameter(torch.randn(4, 3))
    t = torch.randn(5, 4)[:, :3]  # strided: its strides are checked, not contiguity
    specs = module.specs([(nn.Parameter, p.dtype, p.device, (4, 3), None, True),
                          (torch.Tensor, t.dtype, t.device, (5, 3), (4, 1), False)])
    assert module.check(specs, p, t)
    wrong = {
        "type": (p.detach(), t), "dtype": (nn.Parameter(p.double()), t), "shape": (nn.Parameter(torch.randn(3, 4)), t),
        "contiguity": (nn.Parameter(torch.randn(3, 4).t()), t), "strides": (p, t.contiguous()),
        "requires_grad": (nn.Parameter(p.detach(), requires_grad=False), t), "order": (t, p),
        "negation bit": (p, t._neg_view()),
        "not a tensor": (p, 1.0),
    }
    for what, tensors in wrong.items():
        assert not module.check(specs, *tensors), what
    with pytest.raises(TypeError, match="wrong number of tensors"):
        module.check(specs, p)


def test_an_entry_compiled_while_the_extension_builds_switches_to_it(monkeypatch):
    """The first compile on a machine starts the build in the background and guards in Python until it is loaded."""
    module = tensor_checks.wait()
    if module is None:
        pytest.skip("the C++ tensor checks cannot be built here")
    monkeypatch.setattr(tensor_checks, "_module", None)
    monkeypatch.setattr(tensor_checks, "_state", "building")
    monkeypatch.setattr(tensor_checks, "_waiting", [])
    model = nn.Linear(4, 3)
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 4)
    compiled(x)
    assert not _checks_in_cpp(compiled)
    monkeypatch.setattr(tensor_checks, "_wait", lambda build: None)
    monkeypatch.setattr(tensor_checks, "_load", lambda path: module)
    tensor_checks._build_and_load(None)  # what the build thread does when the builder is done
    assert _checks_in_cpp(compiled)
    torch.testing.assert_close(compiled(x), model(x))
    assert len(context_of(compiled).records) == 1

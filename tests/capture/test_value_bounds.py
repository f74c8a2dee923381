"""A branch on a uniform draw compared with a constant outside [0, 1] is decided at capture, with no graph break
(kiln/capture/value_bounds.py): Hugging Face's layer drop (`if torch.rand([]) < self.layerdrop:`, layerdrop 0.0 by
default) broke BART's and Whisper's training graphs at every layer. The draw still runs, so the random stream
advances as in eager; a constant inside the range, or a comparison of several elements, is eager's as before."""
from __future__ import annotations

import operator

import pytest
import torch

import kiln
from kiln.capture.value_bounds import known_comparison

BACKENDS = ["aot_eager", "inductor"]


@pytest.mark.parametrize("op, constant, tensor_first, known", [
    (operator.lt, 0.0, True, False), (operator.lt, -1, True, False), (operator.lt, 1.5, True, True),
    (operator.lt, 1.0, True, None), (operator.lt, 0.5, True, None),
    (operator.le, 0.0, True, None), (operator.le, -0.1, True, False), (operator.le, 1.0, True, True),
    (operator.gt, 1.0, True, False), (operator.gt, -0.5, True, True), (operator.gt, 0.0, True, None),
    (operator.ge, 0.0, True, True), (operator.ge, 1.01, True, False), (operator.ge, 1.0, True, None),
    (operator.gt, 0.0, False, False),  # 0.0 > rand: never
    (operator.lt, 1.5, False, False),  # 1.5 < rand: never
    (torch.lt, 0.0, True, False), ("__lt__", 0.0, True, False), ("ge", 0.0, True, True),
    (operator.lt, float("nan"), True, False), (operator.lt, True, True, None), (operator.eq, 2.0, True, None),
])
def test_which_comparisons_the_range_decides(op, constant, tensor_first, known):
    """Every draw lies in [0, 1) (taken as [0, 1]: a low-precision draw may round up to 1)."""
    assert known_comparison(op, tensor_first, (0.0, 1.0), constant) is known


class DroppedLayer(torch.nn.Module):
    def __init__(self, layerdrop: float):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.layerdrop = layerdrop

    def forward(self, x):
        if self.training:
            dropout_probability = torch.rand([])
            if dropout_probability < self.layerdrop:
                return x
        return self.linear(x).relu()


class Encoder(torch.nn.Module):
    def __init__(self, layerdrop: float):
        super().__init__()
        self.layers = torch.nn.ModuleList(DroppedLayer(layerdrop) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def run(model, x, compiled: bool, backend: str):
    """(output, gradients, the next draw of the random stream) of one training step from seed 1."""
    torch.manual_seed(1)
    out = (kiln.compile(model, backend=backend) if compiled else model)(x)
    out.backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out.detach(), grads, torch.rand(2)


def breaks_of_a_step_matching_eager(layerdrop: float, backend: str) -> dict:
    """The graph breaks of a compiled training step of an encoder with this layer drop, whose output, gradients and
    random stream are checked against eager's."""
    torch.manual_seed(0)
    model, x = Encoder(layerdrop), torch.randn(2, 4)
    want = run(model, x, False, backend)
    kiln.fallbacks.reset()
    torch.testing.assert_close(run(model, x, True, backend), want)
    assert kiln.fallbacks.records() == []
    return dict(kiln.fallbacks.breaks)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_drop_at_zero_is_one_graph_with_eagers_values_and_random_stream(backend):
    assert breaks_of_a_step_matching_eager(0.0, backend) == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_constant_inside_the_range_still_breaks_and_gives_eagers_values(backend):
    assert breaks_of_a_step_matching_eager(0.5, backend).get("data_dependent_branch", 0) >= 1


def test_a_changed_constant_is_guarded():
    """The decision rests on the constant's value: another value recompiles, and its branch is eager's."""
    def f(x, p):
        if torch.rand([]) < p:
            return x * 2
        return x + 1

    compiled, x = kiln.compile(f), torch.ones(3)
    torch.manual_seed(0)
    assert torch.equal(compiled(x, 0.0), x + 1)
    assert torch.equal(compiled(x, 1.5), x * 2)


def test_bool_and_a_reflected_comparison_are_decided_too():
    def f(x):
        if bool(0.0 > torch.rand_like(x[0])):
            return x * 0
        return x * 3

    kiln.fallbacks.reset()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(f)(x), x * 3)
    assert dict(kiln.fallbacks.breaks) == {}


def test_several_elements_raise_what_eager_raises():
    """`if` on a comparison of several elements is ambiguous in eager whatever their values."""
    def f(x):
        if torch.rand(3) < 0.0:
            return x
        return x + 1

    with pytest.raises(RuntimeError, match="ambiguous"):
        f(torch.ones(3))
    with pytest.raises(RuntimeError, match="ambiguous"):
        kiln.compile(f)(torch.ones(3))

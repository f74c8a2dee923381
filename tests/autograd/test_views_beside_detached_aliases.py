"""Outputs on one storage, some of them detached aliases (`t.detach()`), others the tensor and its views.

kiln returns one tensor per shared storage from the graph and rebuilds the other outputs on it. Rebuilt on a
detached alias (fuzz seed 100381: `t2 = a.flip(0); t3 = t2.unsqueeze(-3)` beside `t3.detach()`), a view came
to require grad when the user made the alias a leaf after the call (`t3.detach().requires_grad_()`), where
eager's view never does. kiln rebuilds on the tensor that owns the storage, and each output by its own view
ops (kiln/autograd/view_replay.py): a detached alias stays no view of anything, as in eager.

Compared side by side with eager: values, and each output's requires_grad, is_leaf, whether it is a view and
has a grad_fn, and which output it views (`_base`); then again after `requires_grad_()` on every detached one.
"""
import pytest
import torch

import kiln

BACKENDS = ["aot_eager", "inductor"]


def detached_view_of_a_view(a):
    t2 = a.flip(0)
    t3 = t2.unsqueeze(-3)
    return t2, t3, t3.detach()


def detached_first(a):
    t2 = a * 2
    t3 = t2[1:]
    return t3.detach(), t2, t3


def view_of_a_detached_alias(a):
    t2 = a.sin()
    return t2.detach()[1:], t2[0], t2


def detached_alias_only_then_views(a):
    t2 = a.cos()
    d = t2.detach()
    return d, d.transpose(0, 1), t2.unsqueeze(0)


def made_a_leaf_inside(a):
    """Fuzz seed 100381's shape: the alias made a leaf inside (a graph break), the views returned."""
    t2 = a.flip(0)
    t3 = t2.unsqueeze(-3)
    with torch.enable_grad():
        t4 = t3.detach().requires_grad_() * 2
    return t2, t3, t4


PROGRAMS = [detached_view_of_a_view, detached_first, view_of_a_detached_alias, detached_alias_only_then_views,
            made_a_leaf_inside]


def _state(outs: list[torch.Tensor]) -> list[tuple]:
    bases = [next((k for k, o in enumerate(outs) if t._base is o), "other" if t._base is not None else None)
             for t in outs]
    return [(t.requires_grad, t.is_leaf, t._is_view(), t.grad_fn is None, base) for t, base in zip(outs, bases)]


def _compare(expected, actual, where: str) -> None:
    for k, (e, a) in enumerate(zip(expected, actual)):
        torch.testing.assert_close(a.detach(), e.detach(), msg=lambda m, k=k: f"{where}, output {k}: {m}")
    assert _state(actual) == _state(expected), where


@pytest.mark.sampled(every=2, classes=("program", "requires_grad", "grad_mode"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad_mode", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["plain_input", "input_requires_grad"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_views_beside_detached_aliases(program, requires_grad, grad_mode, backend):
    def make():
        return torch.linspace(-1.0, 2.0, 24, dtype=torch.float64).reshape(3, 4, 2).requires_grad_(requires_grad)

    compiled = kiln.compile(program, backend=backend)
    with torch.set_grad_enabled(grad_mode):
        expected, actual = list(program(make())), list(compiled(make()))
    _compare(expected, actual, "after the call")
    for e, a in zip(expected, actual):
        if not e.requires_grad and e._base is None and a._base is None:  # a detached alias: make it a leaf
            e.requires_grad_()
            a.requires_grad_()
    _compare(expected, actual, "after requires_grad_() on the detached aliases")

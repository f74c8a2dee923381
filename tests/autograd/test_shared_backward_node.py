"""`loss.backward()` inside the compiled function, then a backward through another output of the same graph.

A compiled graph is one backward node for all its outputs (an autograd.Function), as torch.compile's
AOTAutograd graph is; eager has a node per op. The first backward (through the loss) frees that node's saved
tensors, so a later backward through another output of the graph finds them gone, where eager's own node of
that output still holds its own. torch.compile raises "backward through the graph a second time" on these
programs too (measured in `test_torch_compile_raises_too`): a shared limitation. kiln raises the same
RuntimeError, naming the compiled graph's function and the line of the break that ended it (the user's
`backward()`), and the way out; the way out (retain_graph=True) gives eager's gradients. Found by the fuzzer
(seed 100489).
"""
import pytest
import torch

import kiln

BACKENDS = ["aot_eager", "inductor"]


def output_computed_before_the_backward(a):
    kept = a * 2
    loss = a.sin().sum()
    loss.backward()
    return kept * 3


def module_loss_beside_a_kept_activation(a, model):
    kept = a.exp()
    loss = model(a).square().mean()
    loss.backward()
    return kept.tanh()


def two_kept_outputs(a):
    first, second = a.exp(), a * a
    loss = a.sin().sum()
    loss.backward()
    return first + second.sin()


PROGRAMS = [output_computed_before_the_backward, module_loss_beside_a_kept_activation, two_kept_outputs]


def model_of(program):
    torch.manual_seed(0)
    if program is module_loss_beside_a_kept_activation:
        return (torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)),)
    return ()


def run(fn, program):
    a = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_(True)
    out = fn(a, *model_of(program))
    out.sum().backward()
    return a.grad


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_torch_compile_raises_too(program):
    """The reference: torch.compile's graph is one backward node too, and the second backward raises."""
    torch._dynamo.reset()
    run(program, program)  # eager runs it
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        run(torch.compile(program, backend="aot_eager"), program)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_the_error_names_the_graph_and_the_backward_line(program, backend):
    with pytest.raises(RuntimeError) as raised:
        run(kiln.compile(program, backend=backend), program)
    message = str(raised.value)
    assert "backward through the graph a second time" in message  # autograd's own words come first
    assert f"compiled graph of {program.__name__}" in message
    assert "loss.backward()" in message  # the user's line that freed the graph's saved tensors
    assert "retain_graph=True" in message


def retaining(a):
    kept = a * 2
    loss = a.sin().sum()
    loss.backward(retain_graph=True)
    return kept * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_graph_on_the_first_backward_gives_eagers_gradients(backend):
    torch.testing.assert_close(run(kiln.compile(retaining, backend=backend), retaining), run(retaining, retaining))


def backward_twice(a):
    return a.sin().sum() * 2, a.cos()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_second_backward_raises_as_eager_does(backend):
    """A loss run backward twice raises autograd's error under kiln as in eager, from one output or several."""
    for fn in (backward_twice, lambda a: a.sin().sum()):
        for call in (fn, kiln.compile(fn, backend=backend)):
            a = torch.linspace(-1.0, 1.0, 6).requires_grad_(True)
            out = call(a)
            loss = out[0] if isinstance(out, tuple) else out
            loss.backward()
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()

"""The "aot_eager" backend behind kiln's own capture."""
import copy

import torch
import torch.nn as nn

import kiln


def test_aot_eager_is_registered():
    assert "aot_eager" in kiln.list_backends()


def test_compiled_module_trains_like_eager_through_capture():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 2)).double()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(5, 6, dtype=torch.float64)
    out = compiled(x)
    assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"
    out.pow(2).mean().backward()
    reference(x).pow(2).mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)


def test_seed_003_train_function_with_backward_inside():
    """Seed 003: `loss.backward()` inside the compiled function; the model's graph is compiled."""
    torch.manual_seed(0)
    model = nn.Linear(10, 10)
    reference = copy.deepcopy(model)
    x = torch.randn(10)

    @kiln.compile(backend="aot_eager")
    def train(model, x):
        loss = model(x).sum()
        loss.backward()

    train(model, x)
    reference(x).sum().backward()
    torch.testing.assert_close(model.weight.grad, reference.weight.grad)
    torch.testing.assert_close(model.bias.grad, reference.bias.grad)

"""The "aot_eager" backend behind kiln's own capture."""
import copy

import pytest
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


def test_hf_gpt2_with_dropout_trains_bit_for_bit_like_eager():
    """Real captured graphs, dropout 0.1 included: aot_eager draws eager's random stream."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                  bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 8))
    compiled = kiln.compile(model, backend="aot_eager")
    losses = []
    for fn in (compiled, reference):
        torch.manual_seed(5)
        loss = fn(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss)
    assert type(losses[0].grad_fn).__name__ == "CompiledFunctionBackward"
    assert torch.equal(losses[0], losses[1])
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), name

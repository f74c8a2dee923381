"""A tiny GPT-2 over varying sequence lengths: automatic dynamic compiles twice, every length matches eager."""
import copy

import pytest
import torch

import kiln
from kiln.api import context_of

transformers = pytest.importorskip("transformers")

LENGTHS = (8, 11, 13, 16, 20)


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_gpt2_forward_over_sequence_lengths_captures_twice(backend):
    model = tiny_gpt2().eval()
    compiled = kiln.compile(model, backend=backend)
    with torch.no_grad():
        for n in LENGTHS:
            ids = torch.randint(0, 128, (2, n))
            torch.testing.assert_close(compiled(input_ids=ids, use_cache=False).logits,
                                       model(input_ids=ids, use_cache=False).logits, rtol=1e-4, atol=1e-4)
    assert len(context_of(compiled).records) == 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gpt2_training_step_over_sequence_lengths_captures_twice_and_matches_eager(backend):
    """Forward, loss and backward: the length becomes a symbol at the second length, and one
    training compilation (C++ kernels with inductor) serves every later length."""
    ref = tiny_gpt2()
    model = copy.deepcopy(ref)
    compiled = kiln.compile(model, backend=backend)
    opt_ref, opt = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (ref, model))
    for n in LENGTHS:
        ids = torch.randint(0, 128, (2, n))
        for net, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad()
            net(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            o.step()
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=f"{name} at length {n}")
    records = context_of(compiled).records
    assert len(records) == 2
    assert len(records[1].compiled.runners) == 1 and records[1].compiled.specialized is None

"""A small HF GPT-2 trains through kiln's inductor exactly like eager (embedding, attention, GELU, CE)."""
from __future__ import annotations

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


def test_tiny_gpt2_training_matches_eager():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=97, n_positions=32, resid_pdrop=0,
                                  embd_pdrop=0, attn_pdrop=0, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 97, (2, 12))
    loss = torch.compile(model, backend=kiln.inductor)(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(input_ids=ids, labels=ids).loss
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)

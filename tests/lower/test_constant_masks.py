"""Attention masks computed from nothing that mask nothing are dropped before tracing (kiln/lower/constant_masks.py),
so ATen's fused attention runs where eager runs it; any other mask stays."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kiln
from kiln.lower.constant_masks import _eager_accepts, drop_masks_that_mask_nothing


def attention_calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and "scaled_dot_product" in str(n.target)]


def captured(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm
    kiln.compile(fn, backend=backend)(*args)
    (gm,) = graphs
    return gm


def full_mask(q, k, v):
    """A Hugging Face encoder's mask under a compiler: made from ones of the batch's shape, compared, expanded."""
    ones = torch.ones(q.shape[0], q.shape[2], dtype=torch.long)
    mask = (ones[:, None, None, :] > 0).expand(q.shape[0], 1, q.shape[2], q.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def additive_zeros(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, torch.zeros(q.shape[2], q.shape[2]))


def causal_mask(q, k, v):
    mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def input_mask(q, k, v, keep):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :] > 0)


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, 8, 16, generator=g) for _ in range(3)]


def test_an_all_true_mask_and_an_all_zero_additive_mask_are_dropped():
    for fn in (full_mask, additive_zeros):
        gm = captured(fn, *qkv())
        assert drop_masks_that_mask_nothing(gm) == 1
        (call,) = attention_calls(gm)
        assert call.kwargs.get("attn_mask") is None and call.args[3:4] in ((), (None,))
        assert [n for n in gm.graph.nodes if n.op == "call_function"] == [call]  # the mask's computation is gone
        (got,) = gm(*qkv())
        torch.testing.assert_close(got, fn(*qkv()))


def test_a_mask_that_masks_something_or_reads_an_input_stays():
    gm = captured(causal_mask, *qkv())
    assert drop_masks_that_mask_nothing(gm) == 0
    keep = torch.ones(2, 8)
    gm = captured(input_mask, *qkv(), keep)
    assert drop_masks_that_mask_nothing(gm) == 0  # all ones today, but an input: another call may differ


def test_kilns_default_backend_gives_eagers_values_without_the_mask():
    for fn in (full_mask, causal_mask):
        torch.testing.assert_close(kiln.compile(fn)(*qkv()), fn(*qkv()), atol=1e-5, rtol=1e-5)



def test_a_mask_eager_would_reject_is_never_dropped():
    """Dropping a mask of another dtype or of a shape that does not broadcast would turn eager's error into a
    result: such masks stay, and the compiled call raises as eager does."""
    gm = captured(additive_zeros, *qkv())
    (call,) = attention_calls(gm)
    assert _eager_accepts(call, torch.zeros(8, 8))
    assert not _eager_accepts(call, torch.zeros(8, 8, dtype=torch.float64))
    assert not _eager_accepts(call, torch.zeros(3, 8))

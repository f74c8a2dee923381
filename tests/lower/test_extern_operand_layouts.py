"""How the lowering stores the computed operands of extern calls (matmuls, attention, convolutions).

Two rules, each checked on the IR (which layout, how many kernels) and on values against eager:

- A matmul's computed operand is written in the order its copy reads memory, also when a view merged the
  dims it reads (attention's batch and heads folded into bmm's one batch dim): a transposed key
  `k.transpose(-2, -1)` is then stored column-major, in the same order as the query and value copies, and the
  three copies are one coalesced kernel instead of a transposing one of its own (Swin's window attention).
- An operand eager passes expanded (stride 0 on a broadcast dim: an attention mask made per batch and expanded
  over the heads) is stored once and passed expanded, not written out in full for each head (GPT-2's mask).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.lower import ir, lower_graph
from support.lowering import check, trace

B, N, HEADS, D = 4, 10, 3, 8


def window_attention_scores(x, w):
    """Swin's scores: one projection split into q, k, v by a reshape and a permute, `q @ k^T` (a bmm over
    batch x heads)."""
    qkv = (x @ w).reshape(B, N, 3, HEADS, D).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    return ((q * D ** -0.5) @ k.transpose(-2, -1)).softmax(-1) @ v


def split_attention_scores(x, w):
    """GPT-2's split: the projection cut into three along its last dim, each viewed as heads."""
    q, k, v = (x @ w).split(HEADS * D, dim=2)
    q, k, v = (t.view(B, N, HEADS, D).transpose(1, 2) for t in (q, k, v))
    return (q @ k.transpose(-2, -1)).softmax(-1) @ v


def keys_times_values(x, w):
    """`k^T @ v` (linear attention): the transposed operand is the first one."""
    k, v = (x @ w).reshape(B, N, 2, HEADS, D).permute(2, 0, 3, 1, 4).unbind(0)
    return k.transpose(-2, -1) @ v


def attention_inputs(width):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, N, HEADS * D, generator=g), torch.randn(HEADS * D, width * HEADS * D, generator=g)]


def bmm_operands(graph):
    return [a for n in graph.nodes if isinstance(n, ir.Extern) and n.op is torch.ops.aten.bmm.default
            for a in n.args]


CASES = [(window_attention_scores, 3, 1), (split_attention_scores, 3, 1), (keys_times_values, 2, 0)]


@pytest.mark.parametrize("fn, width, transposed", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_transposed_matmul_operand_behind_merged_dims_is_stored_in_its_load_order(fn, width, transposed):
    inputs = attention_inputs(width)
    graph = lower_graph(trace(fn, *inputs), inputs)
    first = bmm_operands(graph)[:2]
    # the transposed operand: its matrix's rows are contiguous (stride 1), its columns a row of D apart
    assert tuple(first[transposed].layout.stride) == (N * D, 1, D), first
    assert tuple(first[1 - transposed].layout.stride)[-1] == 1
    check(fn, *inputs)


def test_the_query_key_and_value_copies_are_one_kernel():
    """Stored in one order, q (scaled), k and v are copied by one kernel reading the projection once."""
    inputs = attention_inputs(3)
    compiled = check(window_attention_scores, *inputs)
    schedule = str(compiled.artefacts["schedule"])
    copies = [line for line in schedule.splitlines() if line.startswith("kernel") and f"outer=({B * HEADS}, " in line
              and "inner=()" in line]
    assert len(copies) == 1, schedule


def test_a_row_major_operand_behind_merged_dims_stays_row_major():
    """`q @ k^T` where k is already stored transposed (its head dim outermost): nothing to swap."""
    def fn(x, w):
        q = (x @ w).reshape(B, N, HEADS, D).transpose(1, 2)
        return q.reshape(B * HEADS, N, D) @ q.reshape(B * HEADS, N, D).transpose(1, 2).contiguous()
    inputs = attention_inputs(1)
    graph = lower_graph(trace(fn, *inputs), inputs)
    assert all(tuple(a.layout.stride)[-1] == 1 for a in bmm_operands(graph)[:1])
    check(fn, *inputs)


def masked_attention(q, k, v, allowed):
    """A boolean mask [B, 1, N, N] turned into an additive bias and expanded over the heads, as
    scaled_dot_product_attention's efficient kernel receives it, for two layers."""
    out = q
    for _ in range(2):
        bias = torch.where(allowed, 0.0, float("-inf")).expand(B, HEADS, N, N)
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(out, k, v, attn_mask=bias)[0]
    return out


def conv_of_expanded(x, w):
    """A convolution over one image repeated along the batch (expanded, as eager passes it)."""
    return F.conv2d((x * 2).expand(B, 3, 6, 6), w)


def attention_inputs_with_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, HEADS, N, D, generator=g) for _ in range(3))
    allowed = torch.ones(N, N, dtype=torch.bool).tril().expand(B, 1, N, N).clone()
    return [q, k, v, allowed]


EXPANDED = [(masked_attention, attention_inputs_with_mask, (B, 1, N, N)),
            (conv_of_expanded, lambda: [torch.randn(1, 3, 6, 6), torch.randn(5, 3, 3, 3)], (1, 3, 6, 6))]


@pytest.mark.parametrize("fn, make_inputs, stored", EXPANDED, ids=[c[0].__name__ for c in EXPANDED])
def test_an_operand_eager_passes_expanded_is_stored_once(fn, make_inputs, stored):
    inputs = make_inputs()
    graph = lower_graph(trace(fn, *inputs), inputs)
    externs = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    expanded = [a for n in externs for a in [*n.args, *n.kwargs.values()]
                if isinstance(a, ir.TensorRef) and 0 in tuple(a.layout.stride)]
    assert expanded, externs
    buffers = {n.name: n for n in graph.nodes if isinstance(n, ir.ComputedBuffer)}
    for ref in expanded:
        assert tuple(buffers[ref.buf].layout.size) == stored
    check(fn, *inputs)


def test_an_operand_that_varies_along_an_expanded_dim_is_stored_whole():
    """The rule reads the value's body, not only eager's strides: a bias that differs per head is computed
    per head even where eager's result of the same shape came from an expand."""
    def fn(q, k, v, allowed):
        heads = torch.arange(HEADS, dtype=torch.float32).view(1, HEADS, 1, 1)
        bias = torch.where(allowed, 0.0, float("-inf")) + heads
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)[0]
    inputs = attention_inputs_with_mask()
    graph = lower_graph(trace(fn, *inputs), inputs)
    (attention,) = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    assert 0 not in tuple(attention.kwargs["attn_mask"].layout.stride)
    check(fn, *inputs)


def test_an_expanded_operand_keeps_eager_s_padded_rows():
    """scaled_dot_product_attention pads its mask's rows to a multiple of 8 before expanding it (the
    memory-efficient kernel requires aligned rows): the mask is stored once with those padded rows."""
    def fn(q, k, v, allowed):
        bias = torch.where(allowed, 0.0, float("-inf"))
        padded = F.pad(bias, (0, 8 - N % 8))[..., :N].expand(B, HEADS, N, N)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=padded)[0]
    inputs = attention_inputs_with_mask()
    graph = lower_graph(trace(fn, *inputs), inputs)
    (attention,) = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    assert tuple(attention.kwargs["attn_mask"].layout.stride) == (N * 16, 0, 16, 1)
    check(fn, *inputs)


def test_an_operand_with_padded_rows_keeps_them():
    """The same for a mask that differs per head (not expanded): stored with eager's padded rows."""
    def fn(q, k, v, allowed):
        heads = torch.arange(HEADS, dtype=torch.float32).view(1, HEADS, 1, 1)
        bias = torch.where(allowed, 0.0, float("-inf")) + heads
        padded = F.pad(bias, (0, 8 - N % 8))[..., :N]
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=padded)[0]
    inputs = attention_inputs_with_mask()
    graph = lower_graph(trace(fn, *inputs), inputs)
    (attention,) = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    assert tuple(attention.kwargs["attn_mask"].layout.stride) == (HEADS * N * 16, N * 16, 16, 1)
    check(fn, *inputs)

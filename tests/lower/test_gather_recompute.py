"""A gather whose index takes many ops to compute is stored once when several values read it.

T5's relative position bias, [1, heads, q, k], is a table lookup at a bucket computed from a logarithm of the
query-key distance, added to the scores of every batch in every layer. A load counted as trivial to
recompute whatever its index cost, so each layer's softmax kernel computed the bucket again at every element
of every batch, and took four times as long as a kernel reading the bias from memory
(benchmarks/results/zoo: T5 inference on an H200). A plain gather (an embedding's rows) stays recomputed."""
from __future__ import annotations

import math

import torch

from support.lowering import check


def position_bias(table: torch.Tensor, length: int) -> torch.Tensor:
    """T5's bucketed relative positions (bidirectional, 16 buckets, max distance 64) looked up in `table`
    [buckets, heads]: [1, heads, length, length]."""
    position = torch.arange(length)
    distance = position[None, :] - position[:, None]
    buckets = (distance > 0).long() * 8
    distance = distance.abs()
    exact = distance < 4
    far = 4 + (torch.log(distance.float() / 4) / math.log(64 / 4) * 4).long()
    buckets = buckets + torch.where(exact, distance, far.clamp(max=7))
    return table[buckets].permute(2, 0, 1).unsqueeze(0)


def layers(table, scores):
    """The bias added to three layers' scores (one tensor of scores per layer), each softmaxed."""
    bias = position_bias(table, scores.shape[-1])
    return [torch.softmax(scores[k] + bias, -1) for k in range(scores.shape[0])]


def test_a_position_bias_read_by_every_layer_is_computed_once():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(16, 4, generator=g)
    scores = torch.randn(3, 2, 4, 24, 24, generator=g)
    compiled = check(layers, table, scores)
    wrapper = compiled.artefacts["wrapper.py"]
    assert wrapper.count("empty_strided((1, 4, 24, 24)") == 1, wrapper  # the bias; the outputs are [2, ...]
    assert compiled.artefacts["kernels.cpp"].count("log_as_eager<float>(") == 1


def test_rows_of_an_embedding_read_twice_are_gathered_twice():
    """An embedding lookup read by two values: each gathers the rows itself, no buffer holds them."""
    g = torch.Generator().manual_seed(1)
    table, ids = torch.randn(10, 6, generator=g), torch.randint(0, 10, (4,), generator=g)
    compiled = check(lambda t, i: (t[i] + 1, t[i].sum(1)), table, ids)
    wrapper = compiled.artefacts["wrapper.py"]
    assert wrapper.count("empty_strided(") == 2, wrapper  # the two outputs

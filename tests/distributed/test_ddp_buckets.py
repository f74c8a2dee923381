"""DDP's bucket split in one process: which parameters share a bucket, and that the split graph computes
what the whole graph does, forward and backward (kiln/distributed/ddp.py). No process group is needed: a
stand-in for the active DDP module carries what the split reads (its caps, module and ignored names)."""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import kiln
from distributed._models import MLP
from kiln.distributed.ddp import assign_buckets


def _captured(model: nn.Module, x: torch.Tensor):
    """The graph kiln captures for `model(x)`, with its example inputs."""
    seen = []

    def keep(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm
    kiln.compile(model, backend=keep)(x)
    return seen[0]


def _buckets(model, first_cap, cap, reduced=None):
    gm, example_inputs = _captured(model, torch.randn(2, 8))
    reduced = reduced if reduced is not None else {id(p) for p in model.parameters()}
    return [sorted(b.params) for b in assign_buckets(gm, example_inputs, reduced, first_cap, cap)]


def test_each_layer_fills_a_bucket_when_the_cap_is_below_a_layer():
    assert _buckets(MLP(), 100, 100) == [["self_0_bias", "self_0_weight"], ["self_2_bias", "self_2_weight"],
                                         ["self_4_bias", "self_4_weight"]]


def test_a_large_cap_keeps_one_bucket_and_a_small_first_cap_closes_the_last_layer_early():
    assert len(_buckets(MLP(), 10**6, 10**6)) == 1
    # the last layer (272 bytes) alone in the first bucket, the rest (1664 bytes) together
    assert _buckets(MLP(), 200, 10**6) == [["self_0_bias", "self_0_weight", "self_2_bias", "self_2_weight"],
                                           ["self_4_bias", "self_4_weight"]]


def test_parameters_ddp_does_not_reduce_fill_no_bucket():
    model = MLP()
    frozen = {id(model[2].weight), id(model[2].bias)}
    buckets = _buckets(model, 100, 100, {id(p) for p in model.parameters()} - frozen)
    assert buckets == [["self_0_bias", "self_0_weight"], ["self_4_bias", "self_4_weight"]]


@pytest.fixture
def active_ddp(monkeypatch):
    """A stand-in for the DDP module whose forward runs (what DDP sets around its inner call)."""
    def activate(model: nn.Module, cap: int):
        ddp = types.SimpleNamespace(module=model, parameters_to_ignore=set(),
                                    _bucket_config=types.SimpleNamespace(first_bucket_bytes_cap=cap,
                                                                         bucket_bytes_cap=cap))
        monkeypatch.setattr(DistributedDataParallel, "_active_ddp_module", ddp)
    return activate


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_split_graph_matches_the_whole_graph(active_ddp, backend):
    model, x = MLP(), torch.randn(3, 8)
    seen = []

    def counting(gm, example_inputs):
        seen.append(gm.meta.get("kiln.ddp_bucket"))
        return kiln.inductor(gm, example_inputs) if backend == "inductor" else gm
    active_ddp(model, 100)
    compiled = kiln.compile(model, backend=counting)
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want)
    assert sorted(seen) == ["submod_0", "submod_1", "submod_2"]


def test_optimize_ddp_off_compiles_the_whole_graph(active_ddp, monkeypatch):
    monkeypatch.setattr(kiln.config, "optimize_ddp", False)
    model, seen = MLP(), []
    active_ddp(model, 100)
    kiln.compile(model, backend=lambda gm, inputs: seen.append(gm) or gm)(torch.randn(2, 8))
    assert len(seen) == 1 and "kiln.ddp_buckets" not in seen[0].meta


class Regions(nn.Module):
    """A no_grad block and an autocast block, each spanning layers that tiny buckets would separate."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))

    def forward(self, x):
        x = self.layers[0](x)
        with torch.no_grad():
            scale = self.layers[2](self.layers[1](x)).sigmoid()
        x = self.layers[3](x) * scale
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = self.layers[5](self.layers[4](x).relu())
        return x.float()


def test_no_split_inside_a_no_grad_or_autocast_block(active_ddp):
    model, x = Regions(), torch.randn(3, 8)
    active_ddp(model, 100)
    subgraphs = []

    def eager_subgraphs(gm, example_inputs):
        subgraphs.append(gm)
        return gm
    compiled = kiln.compile(model, backend=eager_subgraphs)
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad for p in model.parameters()]  # layers 1 and 2 run under no_grad: None
    model.zero_grad(set_to_none=True)
    expected = model(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want)
    # buckets: layer 0 | the no_grad block (layers 1, 2) | layer 3 | the autocast block (layers 4, 5)
    assert len(subgraphs) == 4
    no_grad_bucket = [n.target for n in subgraphs[1].graph.nodes if n.op == "call_function"]
    assert no_grad_bucket.count(torch._C._set_grad_enabled) == 2  # the block whole: switched off and on
    for gm in subgraphs:
        targets = [n.target for n in gm.graph.nodes]
        assert targets.count(torch.amp._enter_autocast) == targets.count(torch.amp._exit_autocast)

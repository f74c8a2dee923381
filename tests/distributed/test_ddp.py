"""DistributedDataParallel with kiln, on two gloo ranks: both wrapping orders, bucketed graphs, no_sync.

`kiln.compile(DDP(m))` compiles the inner module's forward and leaves DDP's own forward (its hooks and
collectives) eager; `DDP(kiln.compile(m))` compiles the same forward inside DDP's. Either way a graph
captured inside DDP's forward is split at DDP's gradient buckets, so that each bucket's all-reduce starts
while the backward of earlier layers runs. Each scenario trains a few steps and compares the parameters
with eager DDP's on every rank.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import kiln
from distributed._models import MLP, batch, max_difference, strict, train
from kiln.api import context_of
from support.ranks import run_on_ranks

TINY_BUCKETS_MB = 1e-4  # 104 bytes: each linear layer's weight and bias fill one bucket


def _against_eager(make, rank: int, *, lr=0.1, step=train, **ddp_kwargs) -> dict:
    """Train `make(model)` and eager DDP from the same weights; the parameter difference and the captures."""
    strict(True)
    model = ddp_kwargs.pop("model", None) or MLP()
    reference = DDP(copy.deepcopy(model), **ddp_kwargs)
    compiled, ctx_owner = make(model, ddp_kwargs)
    losses = step(compiled, torch.optim.SGD(compiled.parameters(), lr=lr), rank)
    eager_losses = step(reference, torch.optim.SGD(reference.parameters(), lr=lr), rank)
    records = context_of(ctx_owner).records
    return {"difference": max_difference(model.parameters(), reference.module.parameters()),
            "losses": (losses, eager_losses), "graphs": len(records),
            "buckets": [r.graph.meta.get("kiln.ddp_buckets") for r in records]}


def scenario_ddp_outside(rank: int) -> dict:
    def make(model, kwargs):
        compiled = kiln.compile(DDP(model, **kwargs))
        return compiled, compiled
    return _against_eager(make, rank, bucket_cap_mb=TINY_BUCKETS_MB)


def scenario_ddp_inside(rank: int) -> dict:
    subgraphs = []

    def counting_inductor(gm, example_inputs):
        subgraphs.append(gm.meta.get("kiln.ddp_bucket"))
        return kiln.inductor(gm, example_inputs)

    def make(model, kwargs):
        inner = kiln.compile(model, backend=counting_inductor)
        return DDP(inner, **kwargs), inner
    result = _against_eager(make, rank, bucket_cap_mb=TINY_BUCKETS_MB)
    return dict(result, subgraphs=subgraphs)


def _accumulate(model, optimizer, rank: int, steps: int = 2, micro: int = 3) -> list[float]:
    """Gradient accumulation: `micro` backward passes per step, all but the last under no_sync()."""
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        for i in range(micro):
            with model.no_sync() if i < micro - 1 else torch.enable_grad():
                loss = model(batch(rank, step * micro + i)).pow(2).mean() / micro
                loss.backward()
            losses.append(loss.item())
        optimizer.step()
    return losses


def scenario_no_sync_accumulation(rank: int) -> dict:
    def make(model, kwargs):
        compiled = kiln.compile(DDP(model, **kwargs))
        return compiled, compiled
    return _against_eager(make, rank, step=_accumulate)


class PartlyUsed(nn.Module):
    """A layer whose output is unused on odd steps: DDP must find its unused parameters."""

    def __init__(self):
        super().__init__()
        self.body, self.extra = MLP(), nn.Linear(4, 4)

    def forward(self, x, use_extra: bool = True):
        y = self.body(x)
        return self.extra(y) if use_extra else y


def _alternating(model, optimizer, rank: int, steps: int = 4) -> list[float]:
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(batch(rank, step), use_extra=step % 2 == 0).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def scenario_find_unused_parameters(rank: int) -> dict:
    def make(model, kwargs):
        compiled = kiln.compile(DDP(model, **kwargs))
        return compiled, compiled
    return _against_eager(make, rank, step=_alternating, model=PartlyUsed(), find_unused_parameters=True,
                          bucket_cap_mb=TINY_BUCKETS_MB)


def scenario_static_graph(rank: int) -> dict:
    def make(model, kwargs):
        compiled = kiln.compile(DDP(model, **kwargs))
        return compiled, compiled
    return _against_eager(make, rank, static_graph=True, bucket_cap_mb=TINY_BUCKETS_MB)


SCENARIOS = ["scenario_ddp_outside", "scenario_ddp_inside", "scenario_no_sync_accumulation",
             "scenario_find_unused_parameters", "scenario_static_graph"]


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(__name__, SCENARIOS)


def _matches_eager(per_rank: list[dict]) -> None:
    for rank, result in enumerate(per_rank):
        assert result["difference"] < 1e-5, f"rank {rank}: parameters differ from eager DDP's by {result['difference']}"
        compiled, eager = result["losses"]
        assert compiled == pytest.approx(eager, rel=1e-5, abs=1e-6), f"rank {rank}"


@pytest.mark.parametrize("scenario", ["scenario_ddp_outside", "scenario_ddp_inside"])
def test_both_wrapping_orders_compile_and_split_at_buckets(results, scenario):
    per_rank = results[scenario]
    _matches_eager(per_rank)
    for result in per_rank:
        assert result["graphs"] == 1  # one capture of the MLP's forward
        buckets = result["buckets"][0]
        # DDP buckets parameters in reverse order: the last layer's bucket ends the graph
        assert buckets == [["self_0_weight", "self_0_bias"], ["self_2_weight", "self_2_bias"],
                           ["self_4_weight", "self_4_bias"]]


def test_each_bucket_is_compiled_by_the_backend(results):
    for result in results["scenario_ddp_inside"]:
        assert sorted(result["subgraphs"]) == ["submod_0", "submod_1", "submod_2"]


def test_no_sync_and_gradient_accumulation(results):
    per_rank = results["scenario_no_sync_accumulation"]
    _matches_eager(per_rank)
    for result in per_rank:  # the default bucket_cap_mb (25 MiB) holds this model whole: one graph, unsplit
        assert result["graphs"] == 1 and len(result["buckets"][0]) == 1


@pytest.mark.parametrize("scenario", ["scenario_find_unused_parameters", "scenario_static_graph"])
def test_find_unused_parameters_and_static_graph(results, scenario):
    per_rank = results[scenario]
    _matches_eager(per_rank)
    assert all(result["graphs"] >= 1 for result in per_rank)

"""FSDP2 (`fully_shard`) with kiln, on two gloo ranks: per-block compile, whole-model compile, bf16 params.

FSDP2's hooks all-gather a module's parameters before its forward and reduce-scatter its gradients after
its backward. kiln keeps them native around compiled code: compiled per block (torchtitan's recipe, the
block wrapped by kiln.compile and then sharded), the hooks run around each block's compiled forward; the
whole sharded model compiled, the graph breaks at each sharded block's call (the `distributed_hooks`
break) and each block's forward is compiled between its hooks. The parameters after a few AdamW steps
match eager FSDP2's on every rank.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import kiln
from distributed._models import Stack, max_difference, strict, train
from kiln import fallbacks
from kiln.api import context_of
from support.ranks import run_on_ranks

BF16_PARAMS = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _shard(model: Stack, policy: dict | None) -> Stack:
    kwargs = {"mp_policy": MixedPrecisionPolicy(**policy)} if policy else {}
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _against_eager(compile_model, rank: int, policy: dict | None = None) -> dict:
    model = Stack()
    reference = _shard(copy.deepcopy(model), policy)
    compiled, owners = compile_model(model, policy)
    losses = train(compiled, torch.optim.AdamW(compiled.parameters(), lr=1e-2), rank)
    eager_losses = train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), rank)
    records = [r for owner in owners for r in context_of(owner).records]
    return {"difference": max_difference(compiled.parameters(), reference.parameters()),
            "losses": (losses, eager_losses), "ops": [r.op_count for r in records],
            "breaks": sorted({r.graph_break.reason.id for r in records if r.graph_break is not None}),
            "fallbacks": [f.kind for f in fallbacks.records()]}


def _compile_blocks(model: Stack, policy: dict | None):
    """torchtitan's order: each block compiled, then sharded (fully_shard wraps the compiled module)."""
    for i, layer in enumerate(model.layers):
        model.layers[i] = kiln.compile(layer)
    return _shard(model, policy), list(model.layers)


def _compile_whole(model: Stack, policy: dict | None):
    compiled = kiln.compile(_shard(model, policy))
    return compiled, [compiled]


def scenario_per_block(rank: int) -> dict:
    strict(True)
    return _against_eager(_compile_blocks, rank)


def scenario_per_block_bf16(rank: int) -> dict:
    strict(True)
    return _against_eager(_compile_blocks, rank, BF16_PARAMS)


def scenario_whole_model(rank: int) -> dict:
    strict(True)  # the breaks at sharded blocks are by design, not fallbacks
    fallbacks.reset()
    return _against_eager(_compile_whole, rank)


SCENARIOS = ["scenario_per_block", "scenario_per_block_bf16", "scenario_whole_model"]


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(__name__, SCENARIOS)


def _matches_eager(per_rank: list[dict], tolerance: float) -> None:
    for rank, result in enumerate(per_rank):
        assert result["difference"] < tolerance, f"rank {rank}: parameters differ by {result['difference']}"
        compiled, eager = result["losses"]
        assert compiled == pytest.approx(eager, rel=tolerance, abs=tolerance), f"rank {rank}"


@pytest.mark.parametrize("scenario, tolerance", [("scenario_per_block", 1e-5), ("scenario_per_block_bf16", 2e-3)])
def test_per_block_compile_matches_eager_fsdp2(results, scenario, tolerance):
    per_rank = results[scenario]
    _matches_eager(per_rank, tolerance)
    for result in per_rank:
        assert len(result["ops"]) == 2 and all(ops > 0 for ops in result["ops"])  # one graph per block
        assert result["breaks"] == [] and result["fallbacks"] == []


def test_whole_model_compile_breaks_at_sharded_blocks(results):
    per_rank = results["scenario_whole_model"]
    _matches_eager(per_rank, 1e-5)
    for result in per_rank:
        assert "distributed_hooks" in result["breaks"] and result["fallbacks"] == []
        # the embedding, and the blocks' forward: one entry serves both blocks, instances of one class
        assert sum(ops > 0 for ops in result["ops"]) >= 2

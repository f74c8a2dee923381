"""Collectives inside compiled graphs, on two gloo ranks: never a fallback, their results eager's.

`dist.all_reduce(t)` in a forward (seed 000's DumbNet) and its siblings are captured as functional
collectives, with the process group by name; kiln's code generator runs them as extern calls into c10d,
each wait placed just before the first use of its result. An asynchronous call (`async_op=True`) breaks
the graph: the Work object it returns stays in Python.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

import kiln
from distributed._models import max_difference, strict
from kiln import fallbacks
from kiln.api import context_of
from kiln.pipeline import GRAPH_LISTENERS
from support.ranks import run_on_ranks


class DumbNet(nn.Module):
    """Seed 000: a forward that all-reduces a statistic of its activations in place."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(1176, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        with torch.no_grad():
            sum_vals = torch.sum(x, 0)
            torch.distributed.all_reduce(sum_vals)
        return x + 0.1 * sum_vals


def _aten_graphs() -> list[str]:
    """The ATen graphs kiln's pipeline compiles from now on in this process (their printed text)."""
    seen = []
    GRAPH_LISTENERS.append(lambda graph, options: seen.append(graph.artefacts.get("aten_graph", "")))
    return seen


def scenario_dumbnet_training(rank: int) -> dict:
    strict(True)
    aten_graphs = _aten_graphs()
    model = DumbNet()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model)
    for net in (compiled, reference):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        for step in range(3):
            optimizer.zero_grad()
            x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(10 * step + rank))
            net(x).pow(2).mean().backward()
            optimizer.step()
    return {"difference": max_difference(model.parameters(), reference.parameters()),
            "graphs": len(context_of(compiled).records), "aten_graphs": aten_graphs}


def collective_variants(x: torch.Tensor) -> tuple:
    """dist's in-place collectives with a reduce op and a group, and a functional collective."""
    y = x * 2
    dist.all_reduce(y, op=dist.ReduceOp.MAX, group=dist.group.WORLD)
    gathered = torch.empty(dist.get_world_size() * x.shape[0], *x.shape[1:])
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    all_gather(gathered, x + 1)
    summed = funcol.all_reduce(x.sin(), "sum", dist.group.WORLD)
    unrelated = x.cos() * 3  # computed while the collectives run
    return y + 1, gathered, summed * unrelated


def scenario_variants(rank: int) -> dict:
    strict(True)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))
    compiled = kiln.compile(collective_variants)
    expected, actual = collective_variants(x), compiled(x)
    again = compiled(x + 1)  # the same graph, new values
    return {"differences": [(a - e).abs().max().item() for a, e in zip(actual, expected, strict=True)],
            "again": [(a - e).abs().max().item() for a, e in zip(again, collective_variants(x + 1), strict=True)],
            "graphs": len(context_of(compiled).records)}


def async_all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    work = dist.all_reduce(y, async_op=True)
    work.wait()
    return y + 1


def scenario_async_op_breaks(rank: int) -> dict:
    strict(False)
    fallbacks.reset()
    x = torch.randn(5, generator=torch.Generator().manual_seed(rank))
    compiled = kiln.compile(async_all_reduce)
    actual, expected = compiled(x), async_all_reduce(x)
    records = context_of(compiled).records
    return {"difference": (actual - expected).abs().max().item(),
            "breaks": [r.graph_break.reason.id for r in records if r.graph_break is not None]}


def mesh_all_reduce(x: torch.Tensor, mesh) -> torch.Tensor:
    return funcol.all_reduce(x.exp(), "avg", mesh) - x


def scenario_device_mesh_group(rank: int) -> dict:
    """A DeviceMesh names the group: captured by identity, passed to the collective by its group's name."""
    from torch.distributed.device_mesh import init_device_mesh

    strict(True)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x = torch.randn(4, generator=torch.Generator().manual_seed(rank))
    compiled = kiln.compile(mesh_all_reduce)
    return {"difference": (compiled(x, mesh) - mesh_all_reduce(x, mesh)).abs().max().item(),
            "graphs": len(context_of(compiled).records)}


def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * 2 + b).sin()


def scenario_in_flight_tensor_input(rank: int) -> dict:
    """An eager functional collective's result (an AsyncCollectiveTensor, with no storage of its own) passed
    to compiled code: the op that reads it runs natively (a break), never a kernel reading its pointer."""
    strict(False)
    fallbacks.reset()
    x = torch.randn(4, generator=torch.Generator().manual_seed(rank))
    compiled = kiln.compile(combine)
    actual = compiled(funcol.all_reduce(x, "sum", dist.group.WORLD), x)
    expected = combine(funcol.all_reduce(x, "sum", dist.group.WORLD), x)
    records = context_of(compiled).records
    return {"difference": (actual - expected).abs().max().item(),
            "breaks": [r.graph_break.reason.id for r in records if r.graph_break is not None]}


SCENARIOS = ["scenario_dumbnet_training", "scenario_variants", "scenario_async_op_breaks",
             "scenario_device_mesh_group", "scenario_in_flight_tensor_input"]


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(__name__, SCENARIOS)


def test_all_reduce_in_a_forward_trains_as_eager(results):
    for rank, result in enumerate(results["scenario_dumbnet_training"]):
        assert result["difference"] < 1e-5, f"rank {rank}: {result['difference']}"
        assert result["graphs"] == 1  # no graph break, and (strict) no fallback
        forward = result["aten_graphs"][0]
        assert "_c10d_functional.all_reduce" in forward and "_c10d_functional.wait_tensor" in forward


def test_collective_variants_match_eager(results):
    for rank, result in enumerate(results["scenario_variants"]):
        assert max(result["differences"]) < 1e-5 and max(result["again"]) < 1e-5, f"rank {rank}: {result}"
        assert result["graphs"] == 1


def test_async_collective_is_a_graph_break(results):
    for result in results["scenario_async_op_breaks"]:
        assert result["difference"] < 1e-6
        assert "unsupported_call" in result["breaks"]


def test_device_mesh_names_the_group(results):
    for result in results["scenario_device_mesh_group"]:
        assert result["difference"] < 1e-5 and result["graphs"] == 1


def test_in_flight_collective_result_as_input_runs_natively(results):
    for result in results["scenario_in_flight_tensor_input"]:
        assert result["difference"] < 1e-6
        assert result["breaks"] == ["unsupported_object"]

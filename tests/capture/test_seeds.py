"""The seeds' examples: seed 000's DumbNet with four potential graph breaks, and seed 004's
forward with a print (two graphs)."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.api import context_of
from support.capture import break_reasons, graph_count


def build_model():
    class DumbNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 6, 5)
            self.pool = nn.MaxPool2d(2, 2)
            self.fc1 = nn.Linear(1176, 10)
            self.fc2 = nn.Linear(10, 10)
            self.fc3 = nn.Linear(10, 10)
            self.fc4 = nn.Linear(10, 10)
            self.d = {}

        def forward(self, x):
            x = self.pool(F.relu(self.conv1(x)))
            x = torch.flatten(x, 1)
            assert torch.all(x >= 0)  # graph break
            x = self.fc1(x)
            self.d['fc1-out'] = x.sum().item()  # graph break
            x = self.fc2(x)
            for _k in np.arange(1):  # graph break
                x = self.fc3(x)
            print(x)  # graph break
            x = self.fc4(x)
            return x

    return DumbNet()


@pytest.mark.allows_fallback('graph_break: the model iterates over np.arange (kiln does not trace numpy)')
def test_dumbnet_runs_like_eager(capsys):
    torch.manual_seed(0)
    net = build_model()
    ref = copy.deepcopy(net)
    compiled = kiln.compile(net, backend="eager")
    for _ in range(2):
        x = torch.randn(4, 3, 32, 32)
        out = compiled(x)
        expected = ref(x)
        torch.testing.assert_close(out, expected)
        assert net.d["fc1-out"] == pytest.approx(ref.d["fc1-out"], rel=1e-5)
    ctx = context_of(compiled)
    reasons = break_reasons(ctx)
    # the break inside the np.arange loop steps the rest of the frame natively (its calls compiled), as
    # torch.compile skips a frame that breaks in a loop: fewer graphs than one per break
    for reason in ("tensor_to_python", "numpy", "print"):
        assert reason in reasons, reasons
    assert graph_count(ctx) >= 3
    printed = capsys.readouterr().out
    assert printed.count("tensor(") == 4  # eager and compiled, twice each


@pytest.mark.allows_fallback('graph_break: the model iterates over np.arange (kiln does not trace numpy)')
def test_dumbnet_gradients_match(capsys):
    torch.manual_seed(0)
    net = build_model()
    ref = copy.deepcopy(net)
    compiled = kiln.compile(net, backend="eager")
    x = torch.randn(2, 3, 32, 32)
    compiled(x).sum().backward()
    ref(x).sum().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_dumbnet_fullgraph_raises_naming_the_first_break():
    net = build_model()
    compiled = kiln.compile(net, backend="eager", fullgraph=True)
    with pytest.raises(kiln.FullGraphError) as info:
        compiled(torch.randn(4, 3, 32, 32))
    message = str(info.value)
    assert "data_dependent_branch" in message
    assert __file__ in message and "assert torch.all(x >= 0)" in message, message


class Seed004(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(8, 16)
        self.linear2 = nn.Linear(16, 16)
        self.linear3 = nn.Linear(16, 4)

    def forward(self, x):
        x = self.linear1(x)
        x = torch.relu(x)
        x = self.linear2(x)

        print(f"shape: {x.shape}")

        x = self.linear3(x)
        x = torch.sigmoid(x)
        return x


def test_seed004_print_gives_two_graphs(capsys):
    torch.manual_seed(0)
    m = Seed004()
    compiled = kiln.compile(m, backend="eager")
    x = torch.randn(5, 8, requires_grad=True)
    out = compiled(x)
    torch.testing.assert_close(out, m(x))
    ctx = context_of(compiled)
    assert graph_count(ctx) == 2
    assert break_reasons(ctx) == ["print"]
    assert capsys.readouterr().out == "shape: torch.Size([5, 16])\n" * 2
    x2 = torch.randn(5, 8, requires_grad=True)
    torch.testing.assert_close(compiled(x2), m(x2))
    assert graph_count(ctx) == 2  # fresh inputs of the same kind reuse both graphs
    compiled(torch.randn(5, 8))
    assert graph_count(ctx) == 3  # requires_grad=False recompiles the first graph only


def test_seed004_fullgraph_raises():
    compiled = kiln.compile(Seed004(), backend="eager", fullgraph=True)
    with pytest.raises(kiln.FullGraphError, match=r"\(print\)"):
        compiled(torch.randn(5, 8))

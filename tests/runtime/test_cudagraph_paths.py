"""CUDA graphs when the path changes between steps (kiln/runtime/cudagraphs.py, "Paths").

A program's calls into recorded graphs need not repeat one sequence: a data-dependent branch picks another
graph, eval runs between training steps, a model is called twice before one backward, a loss is computed every
other step, two models share one captured graph, a generation loop runs a prefill then decode steps of growing
length. Each such program must return eager's values with no error and, after a few steps, replay every path
it takes without recording again. The tests run on the CPU with `FakeOps` (tests/runtime/test_cudagraphs.py)
and on a GPU where there is one (`device`).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import kiln
from kiln.runtime import cudagraphs as cg
from runtime.test_cudagraphs import assert_stale, graphs_on, is_stale, new_pools

TOL = {"rtol": 1e-3, "atol": 1e-4}


@pytest.fixture(params=["cpu", "cuda"])
def device(request, monkeypatch):
    return graphs_on(request.param, monkeypatch)


def mlp(device, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)


def graphs_of(before: set) -> list:
    return [g for pool in new_pools(before) for g in pool.graphs]


def recordings(before: set) -> int:
    return sum(g.stats["recordings"] for g in graphs_of(before))


def assert_grads_equal(model, ref, step):
    for (name, p), q in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **TOL, msg=f"{name}, step {step}")


def run_steps(step, steps: int, before: set, settled_after: int):
    """Runs `step(k)` for k < steps; from step `settled_after` on, no graph records again."""
    for k in range(steps):
        if k == settled_after:
            settled = recordings(before)
        step(k)
    assert recordings(before) == settled, [(g.name, g.stats) for g in graphs_of(before)]
    assert all(g.stats["eager"] == 0 for g in graphs_of(before)), [(g.name, g.stats) for g in graphs_of(before)]


class Branchy(nn.Module):
    """A data-dependent branch: a graph break, then one of two continuations."""

    def __init__(self):
        super().__init__()
        self.stem, self.up, self.down = nn.Linear(16, 16), nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        if x.mean() > 0:
            return self.up(h).relu()
        return self.down(h) * 2


def signed_input(k, device):
    return torch.randn(4, 16, device=device) + (3.0 if k % 2 else -3.0)


@pytest.mark.allows_fallback("graph break: the branch on x.mean() > 0")
def test_alternating_branches_in_training(device):
    torch.manual_seed(0)
    ref = Branchy().to(device)
    model = copy.deepcopy(ref)
    before = set(cg._pools)
    compiled = kiln.compile(model, mode="reduce-overhead")

    def step(k):
        x = signed_input(k, device)
        for net in (ref, compiled):
            net.zero_grad()
        loss_ref = ref(x).square().mean()
        loss = compiled(x).square().mean()
        loss_ref.backward()
        loss.backward()
        torch.testing.assert_close(loss, loss_ref, **TOL)
        assert_grads_equal(model, ref, k)

    run_steps(step, 10, before, settled_after=6)


def test_eval_between_training_steps(device):
    ref = mlp(device)
    model = copy.deepcopy(ref)
    before = set(cg._pools)
    compiled = kiln.compile(model, mode="reduce-overhead")
    opt_ref, opt = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)

    def step(k):
        x = torch.randn(8, 16, device=device)
        for net, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad()
            net(x).square().mean().backward()
            o.step()
        with torch.no_grad():
            ref.eval(), compiled.eval()
            torch.testing.assert_close(compiled(x), ref(x), **TOL)
            ref.train(), compiled.train()
        assert_grads_equal(model, ref, k)

    run_steps(step, 8, before, settled_after=4)


@pytest.mark.parametrize("orders", [["ab"], ["ba"], ["ab", "ba"]], ids=["ab", "ba", "swapping"])
def test_two_models_sharing_one_graph_in_inference(device, orders):
    """Two models of one class share one captured graph (and its pool): the outputs of both stay valid, also
    when the order swaps between steps (the model called second replays after the first one's output was
    returned: its replay must not overwrite it)."""
    refs = {"a": mlp(device, seed=0), "b": mlp(device, seed=1)}
    models = {name: copy.deepcopy(m) for name, m in refs.items()}
    before = set(cg._pools)
    compiled = {name: kiln.compile(m, mode="reduce-overhead") for name, m in models.items()}

    def step(k):
        x = torch.randn(8, 16, device=device)
        order = orders[k % len(orders)]
        with torch.no_grad():
            outs = {name: compiled[name](x) for name in order}
            for name in order:
                assert_valid_and_close(outs[name], refs[name](x), f"{name}, step {k}")

    run_steps(step, 8, before, settled_after=4)


@pytest.mark.parametrize("orders", [["ab"], ["ab", "ba"]], ids=["ab", "swapping"])
def test_two_models_sharing_one_graph_in_training(device, orders):
    """The same in training: both forwards, then the backward of the sum of their losses; each step's outputs
    (the losses, the gradients) are eager's whichever model runs first."""
    refs = {"a": mlp(device, seed=0), "b": mlp(device, seed=1)}
    models = {name: copy.deepcopy(m) for name, m in refs.items()}
    before = set(cg._pools)
    compiled = {name: kiln.compile(m, mode="reduce-overhead") for name, m in models.items()}

    def step(k):
        x = torch.randn(8, 16, device=device)
        order = orders[k % len(orders)]
        for nets in (refs, models):
            for net in nets.values():
                net.zero_grad()
        outs = {name: compiled[name](x) for name in order}
        expected = {name: refs[name](x) for name in order}
        for name in order:
            assert_valid_and_close(outs[name], expected[name], f"{name}, step {k}")
        sum(o.square().mean() for o in outs.values()).backward()
        sum(o.square().mean() for o in expected.values()).backward()
        for name in order:
            assert_grads_equal(models[name], refs[name], k)

    run_steps(step, 8, before, settled_after=4)


def assert_valid_and_close(actual: torch.Tensor, expected: torch.Tensor, msg: str) -> None:
    """`actual` was not overwritten by a replay (on the CPU torch cannot mark it stale: kiln's own mark says so)
    and holds eager's values."""
    assert not is_stale(actual), f"{msg}: overwritten by a replay while still held"
    torch.testing.assert_close(actual, expected, **TOL, msg=msg)


def test_forward_twice_then_backward(device):
    ref = mlp(device)
    model = copy.deepcopy(ref)
    before = set(cg._pools)
    compiled = kiln.compile(model, mode="reduce-overhead")

    def step(k):
        x1, x2 = torch.randn(8, 16, device=device), torch.randn(8, 16, device=device)
        for net in (ref, compiled):
            net.zero_grad()
            (net(x1).square().mean() + net(x2).abs().mean()).backward()
        assert_grads_equal(model, ref, k)

    run_steps(step, 8, before, settled_after=4)


def test_two_forwards_then_their_backwards_one_by_one(device):
    ref = mlp(device)
    model = copy.deepcopy(ref)
    before = set(cg._pools)
    compiled = kiln.compile(model, mode="reduce-overhead")

    def step(k):
        x1, x2 = torch.randn(8, 16, device=device), torch.randn(8, 16, device=device)
        for net in (ref, compiled):
            net.zero_grad()
            first, second = net(x1).sum(), net(x2).square().sum()
            second.backward()
            first.backward()
        assert_grads_equal(model, ref, k)

    run_steps(step, 8, before, settled_after=4)


def test_loss_every_other_step(device):
    """A forward with grad enabled whose backward never runs, every other step."""
    ref = mlp(device)
    model = copy.deepcopy(ref)
    before = set(cg._pools)
    compiled = kiln.compile(model, mode="reduce-overhead")

    def step(k):
        x = torch.randn(8, 16, device=device)
        for net in (ref, compiled):
            net.zero_grad()
        out_ref, out = ref(x), compiled(x)
        torch.testing.assert_close(out, out_ref, **TOL)
        if k % 2 == 0:
            out_ref.square().mean().backward()
            out.square().mean().backward()
            assert_grads_equal(model, ref, k)

    # the forward's recordings alternate (the last step's output is in use when a step without backward follows),
    # and the backward reads whichever replayed: it records for both by the fifth step
    run_steps(step, 9, before, settled_after=5)


class TinyDecoder(nn.Module):
    """One attention layer over a key/value cache that grows by one position per decode step."""

    def __init__(self, d=16):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, cache=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
        att = torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1)
        return self.out(att @ v), torch.stack([k, v])


def generate(model, prompt, steps):
    h, cache = model(prompt)
    outs = [h[:, -1:].clone()]
    for _ in range(steps):
        h, cache = model(h[:, -1:], cache)
        outs.append(h.clone())
    return torch.cat(outs, dim=1)


def test_generation_loop_prefill_then_decode(device):
    torch.manual_seed(0)
    ref = TinyDecoder().to(device)
    before = set(cg._pools)
    compiled = kiln.compile(ref, mode="reduce-overhead", dynamic=False)

    def step(k):
        prompt = torch.randn(1, 3, 16, device=device)
        with torch.no_grad():
            torch.testing.assert_close(generate(compiled, prompt, 3), generate(ref, prompt, 3), **TOL)

    run_steps(step, 5, before, settled_after=2)


def test_output_held_from_an_earlier_step(device):
    """An output kept across steps either keeps its value or raises the stale error when read, never silently
    changes: kept where its memory is not written again, stale where the next replay of its graph writes it."""
    torch.manual_seed(0)
    ref = Branchy().to(device)
    compiled = kiln.compile(copy.deepcopy(ref), mode="reduce-overhead")
    with torch.no_grad():
        for k in range(4):  # both branches recorded
            compiled(signed_input(k, device))
        x_down, x_up = signed_input(0, device), signed_input(1, device)
        down = compiled(x_down)
        up = compiled(x_up)  # the other branch: its own graph and memory
        torch.testing.assert_close(down, ref(x_down), **TOL)
        torch.testing.assert_close(up, ref(x_up), **TOL)
        compiled(signed_input(0, device))  # the down branch again: the earlier step's output is overwritten
        assert_stale(down)
        torch.testing.assert_close(up, ref(x_up), **TOL)

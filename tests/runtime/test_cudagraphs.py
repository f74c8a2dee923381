"""CUDA graphs (kiln/runtime/cudagraphs.py): mode="reduce-overhead" and the "cudagraphs" backend.

The record/replay logic (warm-up, static inputs, copies only where needed, one recording
per signature, stale outputs, fallbacks) runs on the CPU with `FakeOps`, a stand-in for
torch.cuda.CUDAGraph whose replay re-runs the recorded function into the static
outputs. The tests marked `cuda` run the real thing (benchmarks/cudagraphs_check.py
runs them on the GPU and times an MLP).
"""
from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

import kiln
from kiln.config import list_mode_options, list_options, validate_options
from kiln.runtime import cudagraphs as cg

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class FakeOps:
    """torch.cuda.CUDAGraph's part, on the CPU: a replay re-runs the function into the recorded outputs."""

    def __init__(self, fail: Exception | None = None):
        self.fail = fail
        self.captures = 0

    def new_pool(self, device):
        return "pool"

    def capture(self, call, inputs, pool, device):
        if self.fail is not None:
            raise self.fail
        self.captures += 1
        outs = list(call(list(inputs)))
        # A CUDA graph reads its inputs' memory, not the tensor objects it was recorded with, which
        # may since have been invalidated (stale outputs of an earlier replay): keep aliases of our own.
        held = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]
        return (call, held, outs), outs

    def replay(self, graph):
        call, inputs, outs = graph
        for static, new in zip(outs, call(list(inputs))):
            if static.untyped_storage().data_ptr() != new.untyped_storage().data_ptr():
                static.copy_(new)


def graphed(fn, pool=None, name="g"):
    pool = pool or cg.CUDAGraphPool("test", FakeOps())
    return cg.CUDAGraphed(lambda *args: fn(*args), pool, name)


def is_stale(t: torch.Tensor) -> bool:
    if getattr(t, "_kiln_stale", None):
        return True
    try:
        t.data_ptr()
    except RuntimeError as e:
        return "overwritten" in str(e)
    return False


def linear(a, w):
    return [a @ w + 1]


# ---------------------------------------------------------------- the runtime, on the CPU


def test_warmup_then_record_then_replay():
    w = nn.Parameter(torch.randn(4, 3))
    g = graphed(linear)
    xs = [torch.randn(2, 4) for _ in range(4)]
    for k, x in enumerate(xs):
        (out,) = g([x, w])
        torch.testing.assert_close(out, x @ w + 1)
        if k == 0:
            assert g.stats == {"warmups": 1, "recordings": 0, "replays": 0, "eager": 0}
    assert g.stats == {"warmups": 1, "recordings": 1, "replays": 3, "eager": 0}


def test_inputs_copied_only_where_needed():
    w = nn.Parameter(torch.randn(4, 3))
    g = graphed(linear)
    g([torch.randn(2, 4), w])
    g([torch.randn(2, 4), w])
    (rec,) = g.recordings
    assert rec.static_at == [1]  # the parameter is read where it is
    assert [i for i, *_ in rec.copied] == [0]
    g([torch.randn(2, 4), w])
    assert rec.last_copies == 1


def test_output_of_an_earlier_graph_is_read_in_place():
    """A backward graph reads its forward's saved outputs without copying them."""
    pool = cg.CUDAGraphPool("test", FakeOps())
    fwd = graphed(lambda a: [a * 2], pool, "fwd")
    bwd = graphed(lambda s, g: [s * g], pool, "bwd")
    for _ in range(3):
        x, grad = torch.randn(5), torch.randn(5)
        (saved,) = fwd([x])
        (out,) = bwd([saved, grad])
        torch.testing.assert_close(out, x * 2 * grad)
    (rec,) = bwd.recordings
    assert rec.static_at == [0] and rec.last_copies == 1


def test_parameter_address_change_records_again():
    """Each parameter address has its recording. (No output is held across calls: calling w2's model then w1's
    is one step, in which w2's output, if still held, is kept from w1's replay: see the paths' tests.)"""
    g = graphed(linear)
    x = torch.randn(2, 4)
    w1, w2 = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(4, 3))
    for w in (w1, w1, w2, w2, w1):
        torch.testing.assert_close(g([x, w])[0], x @ w + 1)
    assert g.stats["recordings"] == 2


def test_new_shape_records_again_and_old_one_is_kept():
    w = nn.Parameter(torch.randn(4, 3))
    g = graphed(linear)
    for n in (2, 2, 5, 5, 2, 5):
        x = torch.randn(n, 4)
        (out,) = g([x, w])
        assert out.shape == (n, 3)
        torch.testing.assert_close(out, x @ w + 1)
    assert g.stats["recordings"] == 2 and g.stats["warmups"] == 2


def test_a_new_int_input_records_again():
    """An int input (a symbolic int of the captured graph) is launched with its value: a recording made for one
    value must not replay for another."""
    g = graphed(lambda a, n: [a * n])
    x = torch.randn(3)
    for n in (2, 2, 3, 3, 2):
        (out,) = g([x, n])
        torch.testing.assert_close(out, x * n)
    assert g.stats["recordings"] == 2


def test_too_many_signatures_runs_without_graphs(caplog, monkeypatch):
    monkeypatch.setattr(cg, "MAX_RECORDINGS", 1)
    w = nn.Parameter(torch.randn(4, 3))
    g = graphed(linear)
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        for n in (2, 2, 3, 3):
            x = torch.randn(n, 4)
            torch.testing.assert_close(g([x, w])[0], x @ w + 1)
    assert g.disabled and "input signatures" in caplog.text


def test_stale_output_raises():
    w = nn.Parameter(torch.randn(3, 3))
    g = graphed(linear)
    g([torch.randn(2, 3), w])  # warm-up
    (first,) = g([torch.randn(2, 3), w])
    assert not is_stale(first)
    (second,) = g([torch.randn(2, 3), w])
    assert is_stale(first) and not is_stale(second)
    with pytest.raises((RuntimeError, cg.CUDAGraphError), match="overwritten by replay 2 of g"):
        g([first, w])


def test_outputs_fed_back_as_inputs():
    """h = f(h) in a loop (a decode step): the previous output is copied in before the replay overwrites it."""
    g = graphed(lambda h, w: [torch.tanh(h @ w)])
    w = nn.Parameter(torch.randn(4, 4) * 0.5)
    h = h_ref = torch.randn(1, 4)
    for _ in range(5):
        (h,) = g([h, w])
        h_ref = torch.tanh(h_ref @ w)
        torch.testing.assert_close(h, h_ref)
    assert g.stats["recordings"] == 1


def test_replay_invalidates_later_recordings_only():
    """Forward recorded before backward: the backward replay keeps the forward's outputs (the loss) valid."""
    pool = cg.CUDAGraphPool("test", FakeOps())
    fwd = graphed(lambda a: [a * 2], pool, "fwd")
    bwd = graphed(lambda s: [s + 1], pool, "bwd")
    for _ in range(2):
        (f,) = fwd([torch.randn(3)])
        (b,) = bwd([f])
    (f,) = fwd([torch.randn(3)])
    (b,) = bwd([f])
    (b2,) = bwd([f])
    assert not is_stale(f) and is_stale(b) and not is_stale(b2)
    fwd([torch.randn(3)])
    assert is_stale(f) and is_stale(b2)


def test_an_output_in_use_is_not_overwritten_in_its_step():
    """A forward called twice before its backward: the second call must not overwrite the first one's outputs,
    still in use, so it records in the next lane (a memory pool of its own); from then on both replay."""
    pool = cg.CUDAGraphPool("test", FakeOps())
    fwd = cg.CUDAGraphed(lambda a: [a * 2], pool, "fwd", kind="forward")
    bwd = cg.CUDAGraphed(lambda g: [g + 1], pool, "bwd", kind="backward")
    for _ in range(4):
        xs = [torch.randn(3), torch.randn(3)]
        outs = [fwd([x])[0] for x in xs]
        for x, out in zip(xs, outs):
            assert not is_stale(out)
            torch.testing.assert_close(out, x * 2)
        bwd([torch.randn(3)])
    assert [rec.lane for rec in fwd.recordings] == [0, 1]
    # the first step warms up, then records in lane 0; the second records in lane 1; then two replays a step
    assert fwd.stats == {"warmups": 1, "recordings": 2, "replays": 7, "eager": 0}, fwd.stats
    assert pool.step == 4


def test_a_view_keeps_an_output_in_use():
    """Only a view of the output survives (its storage is still used): the next call of the step records anew."""
    pool = cg.CUDAGraphPool("test", FakeOps())
    fwd = cg.CUDAGraphed(lambda a: [a * 2], pool, "fwd", kind="forward")
    fwd([torch.randn(3)])
    fwd([torch.randn(3)])
    x = torch.randn(3)
    view = fwd([x])[0][1:]
    fwd([torch.randn(3)])
    assert not is_stale(view) and torch.equal(view, x[1:] * 2)
    assert [rec.lane for rec in fwd.recordings] == [0, 1]


def test_past_the_recording_limit_a_call_that_would_overwrite_runs_without_graphs(monkeypatch):
    monkeypatch.setattr(cg, "MAX_RECORDINGS", 1)
    pool = cg.CUDAGraphPool("test", FakeOps())
    fwd = cg.CUDAGraphed(lambda a: [a * 2], pool, "fwd", kind="forward")
    xs = [torch.randn(3) for _ in range(4)]
    outs = [fwd([x])[0] for x in xs]  # one step: every output is held
    for x, out in zip(xs, outs):
        assert not is_stale(out)
        torch.testing.assert_close(out, x * 2)
    assert fwd.stats == {"warmups": 1, "recordings": 1, "replays": 1, "eager": 2} and not fwd.disabled


def test_an_output_no_longer_in_use_is_overwritten():
    pool = cg.CUDAGraphPool("test", FakeOps())
    fwd = cg.CUDAGraphed(lambda a: [a * 2], pool, "fwd", kind="forward")
    for _ in range(4):
        fwd([torch.randn(3)])  # nothing holds the output: the next call, in the same step, may overwrite it
    assert len(fwd.recordings) == 1 and fwd.stats["replays"] == 3, fwd.stats


def test_an_output_kept_from_an_earlier_step_goes_stale_when_overwritten():
    g = graphed(lambda a: [a + 1])
    g([torch.randn(3)])
    (kept,) = g([torch.randn(3)])
    (out,) = g([torch.randn(3)])  # a new step: what the last one returned is given up
    assert is_stale(kept) and not is_stale(out) and len(g.recordings) == 1


def test_mark_step_begin_invalidates_every_output():
    g = graphed(lambda a: [a + 1])
    g([torch.randn(3)])
    (out,) = g([torch.randn(3)])
    kiln.cudagraph_mark_step_begin()
    assert is_stale(out)
    (out,) = g([torch.randn(3)])
    assert not is_stale(out)


def test_parameter_returned_as_output_stays_valid():
    w = nn.Parameter(torch.randn(3))
    g = graphed(lambda a, w: [a + w, w])
    for _ in range(3):
        s, same = g([torch.randn(3), w])
    g([torch.randn(3), w])
    assert not is_stale(same) and is_stale(s)


def test_expanded_input_is_copied_through_its_storage():
    g = graphed(lambda a: [a * 3])
    for _ in range(3):
        col = torch.randn(4, 1)
        x = col.expand(4, 3)
        (out,) = g([x])
        torch.testing.assert_close(out, x * 3)
    (rec,) = g.recordings
    assert len(rec.spans) == 1 and not rec.copied


def test_capture_failure_runs_without_graphs(caplog):
    pool = cg.CUDAGraphPool("test", FakeOps(fail=RuntimeError("operation not permitted when stream is capturing")))
    g = graphed(lambda a: [a + 1], pool)
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        for _ in range(4):
            x = torch.randn(3)
            torch.testing.assert_close(g([x])[0], x + 1)
    assert "recording failed" in caplog.text and "not permitted" in caplog.text
    assert g.stats["eager"] == 3 and not g.recordings


def test_gradients_are_not_adopted_by_accumulate_grad():
    """The recording holds each returned alias, so AccumulateGrad copies the gradient into .grad."""
    g = graphed(lambda x: [x * 2])

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return g([grad.contiguous()])[0]

    p = nn.Parameter(torch.randn(3))
    grads = []
    for _ in range(3):
        p.grad = None
        Double.apply(p).sum().backward()
        grads.append(p.grad)
    assert all(not is_stale(gr) for gr in grads)
    assert all(torch.equal(gr, torch.full((3,), 2.0)) for gr in grads)


# ---------------------------------------------------------------- deciding where graphs apply


def mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("how", [{"mode": "reduce-overhead"}, {"backend": "cudagraphs"},
                                 {"options": {"triton.cudagraphs": True}}])
def test_cpu_tensors_run_without_graphs_and_say_why(caplog, how):
    m = mlp()
    x = torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        compiled = kiln.compile(m, **how)
        torch.testing.assert_close(compiled(x), m(x))
        out = compiled(x)
    assert "CUDA graphs off" in caplog.text and "inputs on cpu" in caplog.text
    out.sum().backward()  # training runs too
    assert all(p.grad is not None for p in m.parameters())


def test_dynamic_shapes_run_without_graphs_and_say_why(caplog):
    m = mlp()
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        compiled = kiln.compile(m, mode="reduce-overhead", dynamic=True)
        for n in (3, 5):
            x = torch.randn(n, 4)
            torch.testing.assert_close(compiled(x), m(x))
    assert "dynamic shapes" in caplog.text


def test_graphs_that_mutate_or_synchronize_are_not_recorded():
    def aten_graph(fn, *args):
        from torch.fx.experimental.proxy_tensor import make_fx

        return make_fx(fn)(*args)

    mutating = aten_graph(lambda a: a.add_(1), torch.randn(3))
    reason, _ = cg._aten_reason(mutating, [torch.randn(3)])
    assert "mutates" in reason
    syncing = aten_graph(lambda a: a[a > 0], torch.randn(3))
    reason, _ = cg._aten_reason(syncing, [torch.randn(3)])
    assert "synchronizes" in reason
    plain = aten_graph(lambda a: a * 2, torch.randn(3))
    reason, _ = cg._aten_reason(plain, [torch.randn(3)])
    assert "cpu" in reason


def test_options_and_modes():
    assert validate_options("reduce-overhead", None).triton_cudagraphs is True
    assert validate_options(None, None).triton_cudagraphs is False
    assert validate_options("reduce-overhead", {"triton.cudagraphs": False}).triton_cudagraphs is False
    assert list_mode_options("reduce-overhead") == {"triton.cudagraphs": True}
    assert "reduce-overhead" in list_mode_options()
    assert "triton.cudagraphs" in list_options()
    with pytest.raises(TypeError, match="triton.cudagraphs"):
        validate_options(None, {"triton.cudagraphs": 1})
    with pytest.raises(ValueError, match="reduce-overhead"):
        validate_options("reduce_overhead", None)
    assert "cudagraphs" in kiln.list_backends()
    with pytest.raises(ValueError, match="takes no mode or options"):
        kiln.compile(mlp(), backend="cudagraphs", mode="reduce-overhead")


# ---------------------------------------------------------------- end to end: on the GPU, and on the CPU with FakeOps


@pytest.fixture(params=["cpu", "cuda"])
def device(request, monkeypatch):
    return graphs_on(request.param, monkeypatch)


def graphs_on(device: str, monkeypatch) -> str:
    """"cuda": the real thing (skipped without a GPU); "cpu": the same path with FakeOps standing in for the GPU."""
    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
        return "cuda"
    reason = cg._aten_reason
    monkeypatch.setattr(cg, "_captured_reason", lambda gm, inputs: None)
    monkeypatch.setattr(cg, "_aten_reason", lambda gm, inputs: (reason(gm, inputs)[0] if "cpu" not in (
        reason(gm, inputs)[0] or "cpu") else None, torch.device("cpu")))
    monkeypatch.setattr(cg, "CUDAOps", FakeOps)
    return "cpu"


def assert_stale(t: torch.Tensor) -> None:
    if cg._set_stale is not None:
        with pytest.raises(RuntimeError, match="overwritten"):
            print(t)
    else:
        assert is_stale(t)


def new_pools(before: set) -> list:
    return [p for p in cg._pools if p not in before]


def small_mlp(device, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16)).to(device)


@pytest.mark.parametrize("how", [{"mode": "reduce-overhead"}, {"backend": "cudagraphs"}])
def test_replay_equals_eager(device, how):
    m = small_mlp(device)
    before = set(cg._pools)
    compiled = kiln.compile(m, **how)
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(8, 32, device=device)
            torch.testing.assert_close(compiled(x), m(x), rtol=2e-3, atol=2e-3)
    (pool,) = new_pools(before)
    (graph,) = pool.graphs
    assert graph.stats["recordings"] == 1 and graph.stats["replays"] == 4, graph.stats


def test_new_shape_records_again(device):
    w = nn.Parameter(torch.randn(32, 16, device=device))
    pool = cg.CUDAGraphPool("test")
    g = cg.CUDAGraphed(lambda a, w: [torch.relu(a @ w)], pool, "g",
                       torch.device(device, 0) if device == "cuda" else None)
    for n in (4, 4, 4, 9, 9, 9, 4):
        x = torch.randn(n, 32, device=device)
        torch.testing.assert_close(g([x, w])[0], torch.relu(x @ w))
    assert g.stats["recordings"] == 2 and g.stats["replays"] == 5, g.stats


def test_model_inputs_copied_only_where_needed(device):
    m = small_mlp(device)
    before = set(cg._pools)
    compiled = kiln.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(8, 32, device=device))
    (pool,) = new_pools(before)
    (rec,) = pool.graphs[0].recordings
    assert len(rec.static_at) == 6 and rec.last_copies == 1  # six parameters read in place, the input copied


def test_model_stale_output_raises(device):
    m = small_mlp(device)
    compiled = kiln.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        compiled(torch.randn(8, 32, device=device))
        first = compiled(torch.randn(8, 32, device=device))
        kept = first.clone()
        second = compiled(torch.randn(8, 32, device=device))
        assert_stale(first)
        assert torch.isfinite(second).all() and torch.isfinite(kept).all()


@pytest.mark.parametrize("how", [{"mode": "reduce-overhead"}, {"backend": "cudagraphs"}])
def test_training_equals_eager(device, how):
    ref = small_mlp(device)
    model = copy.deepcopy(ref)
    before = set(cg._pools)
    compiled = kiln.compile(model, **how)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(8, 32, device=device)
        losses = []
        for net, o in ((ref, opt_ref), (compiled, opt)):
            o.zero_grad()
            loss = net(x).square().mean()
            loss.backward()
            o.step()
            losses.append(loss.item())  # the forward's output is still valid after the backward replay
        assert abs(losses[0] - losses[1]) < 1e-4
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-4, msg=f"step {step}")
    (pool,) = new_pools(before)
    kinds = sorted(g.name.rsplit("/", 1)[1] for g in pool.graphs)
    assert kinds == ["backward", "forward"], kinds
    assert all(g.stats["replays"] >= 3 for g in pool.graphs), [g.stats for g in pool.graphs]
    backward = next(g for g in pool.graphs if g.name.endswith("backward"))
    # saved activations and weights are read where the forward replay left them: only the incoming gradient is copied
    assert backward.recordings[0].static_at and backward.recordings[0].last_copies == 1, backward.recordings[0].copied


def test_batchnorm_buffers_mutated_by_the_graph_are_written_back(device):
    """kiln's graphs are functional: BatchNorm's running statistics are outputs, copied back after the replay."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 6 * 6, 4)).to(device)
    model = copy.deepcopy(ref)
    before = set(cg._pools)
    compiled = kiln.compile(model, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(2, 3, 8, 8, device=device)
        for net in (ref, compiled):
            net.zero_grad()
            net(x).square().mean().backward()
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4)
        for a, b in zip(ref.buffers(), model.buffers()):
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4)
    assert all(g.stats["replays"] >= 2 for p in new_pools(before) for g in p.graphs)
    ref.eval(), compiled.eval()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 8, 8, device=device)
            torch.testing.assert_close(compiled(x), ref(x), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("how", [{"mode": "reduce-overhead"}, {"backend": "cudagraphs"}])
def test_random_ops_draw_new_numbers_each_replay(device, how):
    """Dropout inside a recorded graph: each replay advances the generator (no mask frozen at recording)."""
    m = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5)).to(device)
    compiled = kiln.compile(m, **how)
    x = torch.randn(4, 64, device=device)
    masks = []
    for _ in range(5):
        out = compiled(x)
        out.sum().backward()
        masks.append(out.detach() == 0)
    assert not torch.equal(masks[3], masks[4]) and not torch.equal(masks[2], masks[3])
    frac = masks[4].float().mean().item()
    assert 0.3 < frac < 0.7, frac


@cuda
@pytest.mark.allows_fallback("graph: a graph with CPU and CUDA inputs runs through ATen")
def test_cuda_cpu_tensor_in_a_cuda_model_runs_without_graphs(caplog):
    m = small_mlp("cuda")
    with caplog.at_level(logging.INFO, logger="kiln.perf_hints"):
        compiled = kiln.compile(lambda x, s: m(x) * s.cuda(), mode="reduce-overhead")
        for _ in range(3):
            x, s = torch.randn(8, 32, device="cuda"), torch.randn(16)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x, s), m(x) * s.cuda(), rtol=2e-3, atol=2e-3)
    assert "inputs on cpu, cuda" in caplog.text


@cuda
def test_cuda_a_weight_changed_in_place_between_replays_is_seen():
    # The channels-last copies of the 3x3 weights are kept across calls, outside the CUDA graph:
    # a replay must refresh them first, or it would convolve with the old weights.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).cuda().eval()
    compiled = kiln.compile(model, mode="reduce-overhead")
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), rtol=2e-3, atol=2e-3)
        model[2].weight.mul_(-1)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x), rtol=2e-3, atol=2e-3)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(32), nn.Linear(32, 32)

    def forward(self, x):
        return x + torch.relu(self.proj(self.norm(x)))


def blocks(device, n=4, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(Block() for _ in range(n)).to(device)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_layers_sharing_one_graph_record_once_each(device, train):
    """`kiln.compile(layer, mode="reduce-overhead")` per layer of one class shares one captured graph (one
    compile context per backend); each layer's parameters live elsewhere, so the graph keeps one recording per
    layer, and a layer's replay must not overwrite the output the next layer is reading (an output of one
    recording fed to another recording of the same graph)."""
    ref = blocks(device)
    layers = copy.deepcopy(ref)
    kiln.reset()
    before = set(cg._pools)
    compiled = [kiln.compile(layer, mode="reduce-overhead") for layer in layers]
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(layers.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(8, 32, device=device)
        outs = []
        for net, o in ((ref, opt_ref), (compiled, opt)):
            with torch.set_grad_enabled(train):
                h = x
                for layer in net:
                    h = layer(h)
                outs.append(h.detach().clone())
                if train:
                    o.zero_grad()
                    h.square().mean().backward()
                    o.step()
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-3, atol=1e-4, msg=f"step {step}")
        for p, q in zip(ref.parameters(), layers.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-4, msg=f"step {step}")
    forward = [g for pool in new_pools(before) for g in pool.graphs if not g.name.endswith("backward")]
    # one graph for the four layers; in training the first layer's input needs no grad: a graph of its own (as
    # torch.compile's guards tell it too)
    assert len(forward) == 1 + train, [g.name for g in forward]
    assert sum(g.stats["recordings"] for g in forward) == 4, [g.stats for g in forward]
    assert all(g.stats["replays"] >= 2 * g.stats["recordings"] for g in forward), [g.stats for g in forward]

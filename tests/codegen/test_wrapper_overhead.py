"""The generated wrapper's cheap per-call forms behave as the ATen calls they replace.

The wrapper calls an extern through its Python binding (`torch.addmm`) when that binding
can only run the same overload, writes an offset-0 view as `buf.as_strided(size, stride)`,
and renames a dead buffer of the same layout instead of re-viewing it. These tests check
the choices and that the results equal eager's (never timings).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln.codegen.wrapper import omitted_defaults, torch_binding
from support.lowering import check

aten = torch.ops.aten


def test_binding_used_only_when_no_other_overload_fits():
    assert torch_binding(aten.addmm.default, 3, ()) == "torch.addmm"
    assert torch_binding(aten.addmm.default, 3, ("beta",)) == "torch.addmm"
    assert torch_binding(aten.mm.default, 2, ()) == "torch.mm"  # mm.dtype needs a third argument
    assert torch_binding(aten.convolution.default, 9, ()) == "torch.convolution"
    assert torch_binding(aten.avg_pool2d.default, 2, ()) == "torch._C._nn.avg_pool2d"
    assert torch_binding(aten.add.Tensor, 2, ()) is None  # add.Scalar takes two arguments too
    assert torch_binding(aten.full.default, 2, ()) is None  # a factory: torch.full obeys set_default_device
    assert torch_binding(aten.split.Tensor, 2, ()) is None  # torch.split is a Python function
    assert torch_binding(aten.convolution_backward.default, 11, ()) is None  # no binding


def test_a_binding_call_spells_out_the_schema_defaults_it_leaves_out():
    """A binding's default may differ from the schema's: `torch._C._nn.binary_cross_entropy(x, y)` reduces
    nothing, the schema's default is the mean, and a traced graph leaves a mean reduction out."""
    assert omitted_defaults(aten.binary_cross_entropy.default, 2, ()) == ("weight=None", "reduction=1")
    assert omitted_defaults(aten.addmm.default, 3, ("beta",)) == ("alpha=1",)
    assert omitted_defaults(aten.mm.default, 2, ()) == ()


TARGETS = torch.tensor([0, 2, 1, 0])
LOSSES_LEFT_AT_THE_MEAN = {  # (x in (0, 1), y in (0, 1)) -> a loss whose graph node omits reduction=mean
    "binary_cross_entropy": lambda x, y: F.binary_cross_entropy(x, y),
    "multi_margin": lambda x, y: F.multi_margin_loss(x, TARGETS),
    "soft_margin": lambda x, y: F.soft_margin_loss(x, y),
    "huber": lambda x, y: F.huber_loss(x, y),
    "nll": lambda x, y: F.nll_loss(x.log(), TARGETS),
}


@pytest.mark.parametrize("name", sorted(LOSSES_LEFT_AT_THE_MEAN))
def test_a_loss_with_its_default_reduction_matches_eager(name):
    x, y = torch.rand(4, 3) * 0.9 + 0.05, torch.rand(4, 3)
    check(lambda x, y: LOSSES_LEFT_AT_THE_MEAN[name](x, y) * 2, x, y)


def test_extern_with_keyword_arguments_matches_eager():
    b, x, w = torch.randn(8), torch.randn(4, 6), torch.randn(6, 8)
    c = check(lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0).relu(), b, x, w)
    assert "torch.addmm(" in c.artefacts["wrapper.py"]


def test_views_and_reused_buffers_match_eager():
    ws = [torch.randn(8, 8) for _ in range(4)]
    x = torch.randn(3, 8)

    def fn(x, *ws):
        for w in ws:
            x = torch.nn.functional.linear(x, w).tanh()  # a transposed view of w per layer
        return x, x.t()

    c = check(fn, x, *ws)
    wrapper = c.artefacts["wrapper.py"]
    assert ".as_strided(" in wrapper and "_view(" not in wrapper, wrapper
    assert "; del buf" in wrapper and "# reuse" in wrapper, wrapper


def test_view_with_an_offset_of_an_input_with_a_storage_offset():
    base = torch.randn(40)
    x = base[3:35].view(4, 8)  # storage offset 3

    def fn(x, w):
        return (x[1:, 2:] @ w).relu()

    w = torch.randn(6, 5)
    check(fn, x, w)


def test_convolution_extern_matches_eager():
    x, w, b = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    c = check(lambda x, w, b: torch.conv2d(x, w, b, padding=1).relu(), x, w, b)
    assert "torch.convolution(" in c.artefacts["wrapper.py"]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4))


def test_compiled_module_inference_and_training_match_eager():
    model, ref = _mlp(), _mlp()
    compiled = kiln.compile(model)
    x = torch.randn(1, 16)
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), ref(x))
        compiled(x).sum().backward()
        ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def masked_attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_extern_output_the_op_leaves_undefined_is_none_at_run_time():
    """Inference's masked fused attention (cuDNN on an H100) returns None for the logsumexp it does not
    compute, where its fake kernel traced a tensor: the wrapper takes the None, rather than raising
    (and re-running the frame eagerly) on every call."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 64, generator=g).cuda().bfloat16() for _ in range(3))
    mask = torch.randn(2, 1, 128, 128, generator=g).cuda().bfloat16()
    compiled = kiln.compile(masked_attention)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(q, k, v, mask), masked_attention(q, k, v, mask), atol=2e-2, rtol=2e-2)


def _three_projections(x, wq, wk, wv):
    """Attention's q, k and v projections of one normalized activation: each matmul reads the same 2-d view."""
    h = torch.nn.functional.layer_norm(x, (8,))
    return (h @ wq).relu(), (h @ wk).sigmoid(), (h @ wv).tanh()


def _projections_of_a_dead_buffer(x, wq, wk, wv):
    """The same, then the activation dies: its view's local must go with it (the memory plan frees it)."""
    q, k, v = _three_projections(x, wq, wk, wv)
    return (q + k + v).sum(-1)


def _view_read_and_returned(x, wq, wk, wv):
    """A view read by two matmuls and also returned: the output is a tensor of its own."""
    h = x * 2
    return h.view(8, 8) @ wq, h.view(8, 8) @ wk, h.view(8, 8), h


@pytest.mark.parametrize("fn", [_three_projections, _projections_of_a_dead_buffer, _view_read_and_returned])
def test_a_view_read_several_times_is_made_once_per_call(fn):
    x, ws = torch.randn(2, 4, 8), [torch.randn(8, 8) for _ in range(3)]
    wrapper = check(fn, x, *ws).artefacts["wrapper.py"]
    bound = [line for line in wrapper.splitlines() if line.strip().startswith("_v0 = ")]
    assert len(bound) == 1 and wrapper.count("_v0") >= 3, wrapper
    returned = wrapper.splitlines()[-1]
    assert "_v0" not in returned, wrapper  # outputs are never the shared view


def test_a_shared_views_local_is_dropped_with_its_buffer():
    x, ws = torch.randn(2, 4, 8), [torch.randn(8, 8) for _ in range(3)]
    wrapper = check(_projections_of_a_dead_buffer, x, *ws).artefacts["wrapper.py"]
    base = next(line.split(" = ")[1].split(".")[0] for line in wrapper.splitlines()
                if line.strip().startswith("_v0 = "))
    assert any(line.strip().startswith("del ") and base in line and "_v0" in line for line in wrapper.splitlines()), \
        wrapper


@pytest.mark.parametrize("fn", [_three_projections, _view_read_and_returned])
def test_shared_views_under_autograd_match_eager(fn):
    x = torch.randn(2, 4, 8, requires_grad=True)
    ws = [torch.randn(8, 8, requires_grad=True) for _ in range(3)]
    compiled = kiln.compile(fn)
    out, expected = compiled(x, *ws), fn(x, *ws)
    for o, e in zip(out, expected):
        torch.testing.assert_close(o, e)
    sum(o.sum() for o in out).backward()
    got = [t.grad for t in (x, *ws)]
    for t in (x, *ws):
        t.grad = None
    sum(e.sum() for e in expected).backward()
    for g, t in zip(got, (x, *ws)):
        assert (g is None) == (t.grad is None)
        if g is not None:
            torch.testing.assert_close(g, t.grad)

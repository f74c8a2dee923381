"""End-to-end behaviour of the C++ target: trace output, fallbacks, dynamic sizes, the backend."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.lower import ir
from kiln.lower.verify import IRError, verify
from kiln.pipeline import compile_aten_graph
from support.lowering import check, compile_fn, count_externs, trace


def test_trace_enabled_writes_ir_cpp_and_wrapper(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "debug_dir", str(tmp_path))
    x = torch.randn(3, 8)
    check(lambda x: x.softmax(-1), x, options={"trace.enabled": True})
    files = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"ir.txt", "schedule.txt", "kernels.cpp", "wrapper.py"} <= files
    cpp = next(tmp_path.rglob("kernels.cpp")).read_text()
    assert 'extern "C" void fused_max_exp_sum_0' in cpp  # kernels are named by what they fuse


def test_unlowered_op_runs_as_extern():
    x = torch.randn(4, 6)
    c = check(lambda x: torch.logcumsumexp(x.sin(), 1) * 2, x)
    assert count_externs(c) == 1 and c.num_kernels == 2


def test_unsupported_dtype_runs_as_extern():
    x = torch.randn(4, 6, dtype=torch.complex64)  # no code generator computes complex numbers
    c = check(lambda x: (x * 2).abs().sum(-1), x)
    assert count_externs(c) >= 1


@pytest.mark.allows_fallback('graph: in-place ops in the ATen graph, on purpose')
def test_mutating_graph_falls_back_to_aten(fallback_log):
    x = torch.randn(4)
    gm = trace(lambda x: x.add_(1), x.clone())
    with pytest.warns(kiln.KilnFallbackWarning, match="in-place ops"):
        c = compile_aten_graph(gm, [x])
    assert "fallback" in c.artefacts and fallback_log.counts() == {"graph": 1}
    y = x.clone()
    c(y)
    torch.testing.assert_close(y, x + 1)


def test_symbolic_sizes_are_kernel_arguments():
    x = torch.randn(6, 10)
    c = compile_fn(lambda x: (x - x.mean(-1, keepdim=True)).relu() * x.shape[0], x, mode="symbolic")
    cpp = c.artefacts["kernels.cpp"]
    assert "const int64_t s" in cpp, cpp[-1500:]
    for shape in [(6, 10), (3, 17), (40, 5)]:
        y = torch.randn(*shape)
        torch.testing.assert_close(c(y)[0], (y - y.mean(-1, keepdim=True)).relu() * shape[0])


def test_verifier_rejects_broken_ir():
    lay = ir.Layout.contiguous((4,), torch.float32)
    bad = ir.LoweredGraph(inputs=[ir.InputBuffer("arg0", lay)], nodes=[
        ir.ComputedBuffer("buf0", lay, ir.Pointwise((4,), ir.Load("buf9", 0, torch.float32)))], outputs=[])
    try:
        verify(bad)
    except IRError as e:
        assert "buf9" in str(e)
    else:
        raise AssertionError("verify accepted a load of an undefined buffer")


def test_torch_compile_backend_inference_and_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                torch.nn.Linear(32, 3))
    x = torch.randn(5, 12)
    compiled = torch.compile(model, backend=kiln.inductor)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    F.cross_entropy(compiled(x), torch.tensor([0, 1, 2, 0, 1])).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    F.cross_entropy(model(x), torch.tensor([0, 1, 2, 0, 1])).backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-5)


def test_inductor_is_the_registered_backend():
    assert "inductor" in kiln.list_backends()
    from kiln.backends import resolve_backend
    bound = resolve_backend("inductor", None, {"trace.enabled": False})
    assert bound.fn is kiln.inductor


def test_attention_block_training_matches_eager():
    """MultiheadAttention + LayerNorm + MLP, forward and backward (flash attention stays an extern)."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.ln = torch.nn.LayerNorm(d)
            self.attn = torch.nn.MultiheadAttention(d, 4, batch_first=True)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.GELU(), torch.nn.Linear(64, d))

        def forward(self, x):
            h = self.ln(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(x)

    model = Block()
    x = torch.randn(2, 8, 32)
    ((torch.compile(model, backend=kiln.inductor)(x) ** 2).mean()).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ((model(x) ** 2).mean()).backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)


def test_extern_result_restrided_to_a_traced_broadcast_layout():
    """An extern whose traced result was expanded (stride 0) but which returns a dense tensor
    (torch versions differ) is copied once per slice and expanded again, not written through stride 0."""
    from kiln.codegen.wrapper import _restride

    dense = torch.randn(3, 1).expand(3, 4).contiguous()
    out = _restride(dense, (3, 4), (1, 0))
    assert out.stride() == (1, 0)
    assert torch.equal(out, dense)


@pytest.mark.parametrize("batch", [1, 3])
def test_extern_results_are_compared_only_on_dims_of_more_than_one_element(batch):
    """Attention on the CPU returns [B, H, S, D] with a batch stride of its own; at a batch of one that stride
    is meaningless and the result needs no restride (no call per step), at a batch of three it is checked."""
    q, k, v = (torch.randn(batch, 2, 5, 8) for _ in range(3))

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v) * 2

    c = check(attention, q, k, v)
    wrapper = c.artefacts["wrapper.py"]
    checked = [line for line in wrapper.splitlines() if "_restride(" in line]
    assert checked, wrapper
    if batch == 1:
        assert all("_s[0]" not in line for line in checked), wrapper  # the batch dim is never compared
        assert any(line.strip().startswith("_s = ") for line in wrapper.splitlines()), wrapper
    else:
        assert any(".stride() != (" in line for line in checked), wrapper


def test_a_size_one_dim_stride_difference_does_not_copy():
    """The wrapper's check passes a tensor whose strides differ from the traced ones only on size-1 dims: its
    data is laid out as traced, and copying it every call would cost a kernel and an allocation."""
    from kiln.codegen.wrapper import WrapperCodegen

    layout = ir.Layout((1, 2, 5), (10, 5, 1), torch.float32)
    gen = WrapperCodegen.__new__(WrapperCodegen)
    gen.lines = []
    gen.line = gen.lines.append
    gen.restride("out", "res", layout)
    copies = []
    namespace = {"_restride": lambda t, size, stride: copies.append(t.stride()) or t}
    namespace["res"] = torch.empty(1, 2, 5).as_strided((1, 2, 5), (7, 5, 1))  # batch stride differs: no copy
    exec("\n".join(gen.lines), namespace)
    assert copies == []
    namespace["res"] = torch.empty(2, 5, 1).as_strided((1, 2, 5), (10, 1, 2))  # a real transpose: copied
    exec("\n".join(gen.lines), namespace)
    assert copies == [(10, 1, 2)]

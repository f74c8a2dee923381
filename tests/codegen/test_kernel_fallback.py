"""Fallback granularity: a kernel that fails to generate or build runs its ops through ATen alone; the rest
of the graph keeps its generated kernels (kiln/fallbacks.py `with_kernel_fallbacks`).

Each test breaks the kernels that compute `exp` (their source is made unbuildable, or their build raises),
then checks that the graph still compiles, the `exp` ran through ATen, the other kernels are generated,
the result is eager's, and the fallback is counted and warned once. Under KILN_STRICT=1 the same break is
an error naming the graph, the kernel and the cause.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.codegen import cpp
from kiln.codegen.triton.kernel import TritonKernel
from kiln.lower import ir
from kiln.pipeline import compile_aten_graph
from support.lowering import assert_same, trace
from support.triton_device import DEVICE, skip_unless_kernels_run


def relu_exp_tanh(x, w):
    """Three kernels split by two matmuls: relu, exp + 1, tanh."""
    return ((torch.relu(x) @ w).exp() + 1) @ w, (x @ w).tanh()


def softmax_and_norm(x):
    """Two reduction kernels (over rows, over columns): exp only in the softmax."""
    return x.softmax(-1), (x * x).sum(0).sqrt(), x.t().contiguous().sin() * 2


def computes_exp(kernel_name: str) -> bool:
    """Kernels are named by the ops they fuse (`fused_max_exp_sum_0`)."""
    return "exp" in kernel_name.split("_")


def broken_exp_cpp(monkeypatch):
    """C++ kernels containing exp get a line the compiler rejects: the build of the whole source fails."""
    generate = cpp.generate_kernel

    def generate_broken(group, layouts):
        kernel = generate(group, layouts)
        if computes_exp(group.name):
            kernel.source = kernel.source.replace("{", "{\n#error injected by the test\n", 1)
        return kernel
    monkeypatch.setattr(cpp, "generate_kernel", generate_broken)


def extern_ops(compiled) -> set:
    return {n.op for n in compiled.artefacts["ir"].nodes if isinstance(n, ir.Extern)}


def compile_cpp(fn, *inputs):
    return compile_aten_graph(trace(fn, *inputs), list(inputs))


CASES = [(relu_exp_tanh, lambda: (torch.randn(6, 8), torch.randn(8, 8)), 2),
         (softmax_and_norm, lambda: (torch.randn(5, 7),), 1)]


@pytest.mark.allows_fallback("kernel: the test breaks the build of the kernels computing exp")
@pytest.mark.parametrize("fn, make_inputs, min_kernels", CASES, ids=["matmuls", "reductions"])
def test_cpp_build_failure_falls_back_one_kernel(fn, make_inputs, min_kernels, monkeypatch, fallback_log):
    broken_exp_cpp(monkeypatch)
    inputs = make_inputs()
    with pytest.warns(kiln.KilnFallbackWarning) as warned:
        compiled = compile_cpp(fn, *inputs)
    assert "fallback" not in compiled.artefacts  # the graph compiled: only the kernel fell back
    assert not any(map(computes_exp, compiled.artefacts["kernel_names"]))
    assert compiled.num_kernels >= min_kernels, compiled.artefacts["schedule"]
    assert torch.ops.aten.exp.default in extern_ops(compiled)  # the exp now runs through ATen
    assert_same(compiled(*inputs), fn(*inputs))
    kernels = [f for f in fallback_log.records() if f.kind == "kernel"]
    assert fallback_log.counts() == {"kernel": len(kernels)} and kernels
    assert all(f.stage == "build" and "C++ compilation failed" in f.cause for f in kernels)
    assert len([w for w in warned if issubclass(w.category, kiln.KilnFallbackWarning)]) == 1  # once per graph


def test_cpp_build_failure_is_an_error_under_strict(monkeypatch):
    broken_exp_cpp(monkeypatch)
    x, w = torch.randn(6, 8), torch.randn(8, 8)
    with pytest.raises(kiln.KilnStrictError) as e:
        compile_cpp(relu_exp_tanh, x, w)
    f = e.value.fallback
    assert f.kind == "kernel" and f.kernel and f.graph.startswith("aten")
    assert f.kernel in str(e.value) and f.graph in str(e.value) and "C++ compilation failed" in str(e.value)


@pytest.mark.allows_fallback("kernel: the test makes the generator raise for the kernels computing exp")
def test_cpp_codegen_failure_falls_back_one_kernel(monkeypatch, fallback_log):
    generate = cpp.generate_kernel

    def refuse_exp(group, layouts):
        kernel = generate(group, layouts)
        if computes_exp(group.name):
            raise NotImplementedError("injected: no C++ for this kernel")
        return kernel
    monkeypatch.setattr(cpp, "generate_kernel", refuse_exp)
    x, w = torch.randn(6, 8), torch.randn(8, 8)
    with pytest.warns(kiln.KilnFallbackWarning):
        compiled = compile_cpp(relu_exp_tanh, x, w)
    assert compiled.num_kernels == 2 and not any(map(computes_exp, compiled.artefacts["kernel_names"]))
    assert_same(compiled(x, w), relu_exp_tanh(x, w))
    [f] = fallback_log.records()
    assert (f.kind, f.stage) == ("kernel", "codegen") and "injected" in f.cause


@pytest.mark.allows_fallback("kernel: the test makes the Triton build of the kernels computing exp raise")
@pytest.mark.parametrize("fn, make_inputs, min_kernels", CASES, ids=["matmuls", "reductions"])
def test_triton_build_failure_falls_back_one_kernel(fn, make_inputs, min_kernels, monkeypatch, fallback_log):
    skip_unless_kernels_run()
    precompile = TritonKernel.precompile

    def broken_exp(self, module):
        if computes_exp(self.group.name):
            raise RuntimeError("injected: this kernel does not compile")
        return precompile(self, module)
    monkeypatch.setattr(TritonKernel, "precompile", broken_exp)
    inputs = [t.to(DEVICE) for t in make_inputs()]
    with pytest.warns(kiln.KilnFallbackWarning):
        compiled = compile_aten_graph(trace(fn, *inputs), list(inputs), {"cpu_backend": "triton"})
    assert "fallback" not in compiled.artefacts
    assert not any(map(computes_exp, compiled.artefacts["kernel_names"]))
    assert compiled.num_kernels >= min_kernels
    assert torch.ops.aten.exp.default in extern_ops(compiled)
    assert_same(compiled(*inputs), fn(*inputs))
    assert set(fallback_log.counts()) == {"kernel"}
    assert all(f.stage == "build" and "injected" in f.cause for f in fallback_log.records())

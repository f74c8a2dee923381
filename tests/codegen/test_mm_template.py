"""max-autotune's matmul template (kiln/codegen/triton/templates.py) and shape padding.

The Triton kernels run on `DEVICE` (tests/support/triton_device.py): on the CPU through Triton's interpreter
(TRITON_INTERPRET=1, KILN_CPU_BACKEND=triton as in test_triton_kernels.py), on the GPU for real under
KILN_TRITON_TEST_DEVICE=cuda. Tensors are tiny because the interpreter is slow. Each template is checked
against eager with the template forced to win (a deterministic timer passed to `load_kernels`) and
with ATen forced to win, so both paths of the choice are exercised.
"""
from __future__ import annotations

import copy
import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F

from support.triton_device import DEVICE, skip_module_unless_kernels_run

skip_module_unless_kernels_run()

import kiln  # noqa: E402
from kiln.codegen import triton as triton_target  # noqa: E402
from kiln.codegen.describe import name_kernels  # noqa: E402
from kiln.codegen.triton import templates  # noqa: E402
from kiln.codegen.wrapper import generate_wrapper  # noqa: E402
from kiln.config import validate_options  # noqa: E402
from kiln.lower import ir, lower_graph  # noqa: E402
from kiln.pipeline import compile_aten_graph  # noqa: E402
from kiln.schedule.fusion import schedule  # noqa: E402
from kiln.schedule.memory import plan_memory  # noqa: E402
from support.lowering import assert_same, trace  # noqa: E402

MAX = validate_options("max-autotune-no-cudagraphs", {"cpu_backend": "triton"})
DEFAULT = validate_options(None, {"cpu_backend": "triton"})


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))


def fresh_process(name: str) -> None:
    """What a new process would see: no kernel module loaded, an empty autotune cache."""
    triton_target._loaded.clear()
    os.environ["KILN_CACHE_DIR"] = os.path.join(os.environ["KILN_CACHE_DIR"], name)


def prefer(kind: str):
    """A timer under which every candidate whose label starts with `kind` is fastest (and each runs once)."""
    def timer(label, run):
        run()
        return 1.0 if label.startswith(kind) else 2.0
    return timer


def randn(*size, dtype=torch.float32):
    """Random inputs on the device the kernels run on."""
    return torch.randn(*size, dtype=dtype).to(DEVICE)


def prepare(graph, options, device):
    """The Triton target's rewrite before scheduling, given the option fields it reads."""
    return templates.prepare(graph, device, max_autotune=options.max_autotune, shape_padding=options.shape_padding)


def build(fn, inputs, options, timer=None, device=DEVICE):
    """The stages of kiln.pipeline, with `timer` given to the autotuned kernels:
    (call, schedule, namespace, kernel source)."""
    gm = trace(fn, *inputs)
    graph = lower_graph(gm, inputs)
    sched = schedule(graph, prepare(graph, options, device), epilogue_fusion=options.epilogue_fusion)
    name_kernels(sched)
    plan = plan_memory(sched)
    source, kernels = triton_target.generate_module(sched, max_autotune=options.max_autotune)
    wrapper, namespace = generate_wrapper(sched, plan, kernels, device=device)
    namespace.update(triton_target.load_kernels(source, kernels, timer=timer))
    exec(compile(wrapper, "<test wrapper>", "exec"), namespace)
    boxed = namespace["call"]  # takes one list of the inputs (the boxed convention), which it empties
    return (lambda *args: boxed(list(args))), sched, namespace, source


def template_groups(sched):
    return [g for g in sched.kernels() if sched.template_of(g) is not None]


def check_both_ways(fn, *inputs, epilogue_nodes=None, options=MAX):
    """Compile under max-autotune with the template winning, then with ATen winning; both equal eager."""
    ref = fn(*inputs)
    for kind in ("template", "aten"):
        fresh_process(kind)
        call, sched, ns, source = build(fn, list(inputs), options, prefer(kind))
        groups = template_groups(sched)
        assert groups, str(sched)
        assert_same(call(*inputs), ref)
        for g in groups:
            assert ns[g.name].decisions[()]["winner"].startswith(kind)
        if epilogue_nodes is not None:
            assert [len(g.nodes) - 1 for g in groups] == epilogue_nodes, str(sched)
    return sched, source


def test_linear_relu_epilogue_is_fused_into_the_template():
    x, w, b = randn(5, 24), randn(10, 24), randn(10)
    sched, source = check_both_ways(lambda x, w, b: F.relu(F.linear(x, w, b)) * 0.5, x, w, b, epilogue_nodes=[2])
    assert "tl.dot" in source and "Autotuned(" in source
    assert len(sched.kernels()) == 1  # matmul, bias, relu and scale: one kernel


def test_mm_without_epilogue_and_uneven_k():
    a, b = randn(7, 19), randn(19, 9)  # K=19: the last K block is masked
    check_both_ways(torch.mm, a, b, epilogue_nodes=[0])


def test_bmm_with_transposed_operand_and_epilogue():
    a, b = randn(3, 6, 17), randn(3, 5, 17)
    check_both_ways(lambda a, b: torch.tanh(torch.bmm(a, b.transpose(1, 2))) + 1, a, b, epilogue_nodes=[1])


def test_matmul_output_read_elsewhere_is_stored():
    x, w = randn(4, 16), randn(16, 8)

    def fn(x, w):
        y = x @ w
        return y.sigmoid(), y.sum(0)
    sched, _ = check_both_ways(fn, x, w)
    group = template_groups(sched)[0]
    assert group.nodes[0].name not in group.local


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_addmm(dtype):
    x, w, b = randn(4, 16, dtype=dtype), randn(16, 8, dtype=dtype), randn(8, dtype=dtype)
    check_both_ways(lambda b, x, w: torch.addmm(b, x, w).relu(), b, x, w)


def test_epilogue_fusion_off_keeps_the_epilogue_apart():
    x, w, b = randn(5, 24), randn(10, 24), randn(10)
    fn = lambda x, w, b: F.relu(F.linear(x, w, b))  # noqa: E731
    sched, _ = check_both_ways(fn, x, w, b, epilogue_nodes=[0], options=dataclasses.replace(MAX, epilogue_fusion=False))
    assert len(sched.kernels()) == 2


def test_compile_aten_graph_under_each_mode():
    x, w, b = randn(5, 24), randn(10, 24), randn(10)
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b)).softmax(-1)  # noqa: E731
    ref = fn(x, w, b)
    for mode in ("default", "max-autotune-no-cudagraphs", "max-autotune"):
        options = validate_options(mode, {"cpu_backend": "triton"})
        compiled = compile_aten_graph(trace(fn, x, w, b), [x, w, b], options)
        assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
        assert_same(compiled(x, w, b), ref)
        src = compiled.artefacts["kernels.py"]
        # a matmul this small is a template in every mode; only max-autotune benchmarks tiles against ATen
        assert "tl.dot" in src and "extern" not in str(compiled.artefacts["schedule"])
        assert ("Autotuned(" in src) == (mode != "default")


def _template_specs(m: int, k: int, n: int, options) -> dict:
    x, w = torch.empty(m, k), torch.empty(k, n)
    graph = lower_graph(trace(lambda x, w: x @ w, x, w, mode="fake"), [x, w])
    return prepare(graph, options, "cuda")


def test_default_mode_makes_templates_of_small_matmuls_only():
    """Small (host-bound) matmuls become templates without autotuning; a long K (one program would walk it
    alone) or many multiply-adds keep cuBLAS, which max-autotune may still beat."""
    assert len(_template_specs(1, 256, 256, DEFAULT)) == 1          # an MLP layer at batch 1
    assert len(_template_specs(128, 64, 3136, DEFAULT)) == 1        # a small CNN's weight gradient
    assert _template_specs(64, 3136, 128, DEFAULT) == {}            # K = 3136: two programs, 98 steps each
    assert _template_specs(4096, 768, 768, DEFAULT) == {}           # BERT's projections
    assert len(_template_specs(4096, 768, 768, MAX)) == 1
    assert templates.small_matmul(1, 1, 256, 256) and not templates.small_matmul(1, 64, 128, 3136)


def test_default_template_fuses_bias_and_activation_without_autotuning():
    x, w, b = randn(3, 40), randn(20, 40), randn(20)
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    call, sched, ns, source = build(fn, [x, w, b], DEFAULT)
    assert_same(call(x, w, b), fn(x, w, b))
    (group,) = sched.kernels()
    assert sched.template_of(group) is not None and group.name.startswith("fused_mm_")
    assert "Autotuned(" not in source and "BLOCK_M=16, BLOCK_N=32, BLOCK_K=64" in source


def test_symbolic_sizes_keep_the_extern():
    x, w = torch.randn(5, 16), torch.randn(16, 8)
    gm = trace(lambda x, w: (x @ w).relu(), x, w, mode="symbolic")
    graph = lower_graph(gm, [x, w])
    assert prepare(graph, MAX, "cpu") == {}


# ----------------------------------------------------------------------------- shape padding


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_padded_matmul_equals_aten(op):
    torch.manual_seed(0)
    if op == "bmm":
        args = (torch.randn(2, 5, 13), torch.randn(2, 13, 6))
    elif op == "mm":
        args = (torch.randn(5, 13), torch.randn(13, 6))
    else:
        args = (torch.randn(6), torch.randn(5, 13), torch.randn(13, 6))
    ref = getattr(torch, op)(*args)
    got = templates.PaddedMatmul(op, 8)(*args)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref)


def test_padding_is_for_cuda_tensor_cores_only():
    assert templates.padding_multiple(torch.float16, "cuda") == 8
    assert templates.padding_multiple(torch.bfloat16, "cuda") == 8
    assert templates.padding_multiple(torch.float16, "cpu") == 0
    assert templates.needs_padding(13, 16, 8) and not templates.needs_padding(16, 24, 8)


def _padded_ops(m: int, k: int, n: int) -> list:
    """The PaddedMatmul ops the shape-padding pass puts in an fp16 m x k @ k x n graph told it runs on CUDA."""
    x, w = torch.randn(m, k, dtype=torch.float16), torch.randn(k, n, dtype=torch.float16)
    graph = lower_graph(trace(lambda x, w: x @ w, x, w), [x, w])
    assert prepare(graph, DEFAULT, "cuda") == {}
    return [n.op for n in graph.nodes if isinstance(getattr(n, "op", None), templates.PaddedMatmul)]


def test_shape_padding_rewrites_compute_bound_externs_on_cuda_graphs():
    """The pass itself, on CPU graphs told they run on CUDA: a compute-bound matmul with an unaligned K
    calls PaddedMatmul, which computes the same product; a small (memory-bound) one is left alone, since
    copying its operands costs more than an aligned kernel saves."""
    padded = _padded_ops(1024, 1001, 1024)
    assert len(padded) == 1
    x, w = torch.randn(64, 1001), torch.randn(1001, 96)
    exact = x.double() @ w.double()  # the BLAS sums 1001 products in an order of its own, padded or not
    assert (padded[0](x, w) - exact).abs().max() <= 2 * (x @ w - exact).abs().max() + 1e-5
    assert _padded_ops(64, 3137, 128) == []
    assert templates.worth_padding(8192, 50257, 768) and not templates.worth_padding(64, 128, 3137)


def _logits_grad_graph(pad: bool):
    """A language model's head backward in small: dL (computed, rows of an odd length, scaled by a
    0-d tensor as the loss's 1/N) read by dX = dL @ W and dW = dL^T @ X."""
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randn(2048, 1101, generator=g, dtype=torch.float16),
              torch.randn(1101, 512, generator=g, dtype=torch.float16),
              torch.randn(2048, 512, generator=g, dtype=torch.float16), torch.tensor(0.5, dtype=torch.float16)]

    def fn(dl, w, x, scale):
        d = dl * scale + 1
        return d @ w, d.t() @ x

    return fn, inputs, lower_graph(trace(fn, *inputs), inputs, pad_matmul_operands=pad)


def test_matmul_operand_with_long_unaligned_rows_is_stored_with_zero_padded_rows():
    """On the GPU the lowering stores dL with rows padded to 128 bytes, zeros past column 1101: dW reads
    the transposed view with an aligned leading dimension, and dX's padded matmul reads the whole rows
    as K instead of copying dL into a padded tensor. Off the GPU nothing is padded."""
    _, _, plain = _logits_grad_graph(pad=False)
    assert plain.zero_padded == {}
    fn, inputs, graph = _logits_grad_graph(pad=True)
    (buf, width), = graph.zero_padded.items()
    assert width == 1101 and graph.buffer_layouts()[buf].size[-1] == 1152  # 1101 fp16 -> 2304 bytes
    padded = next(n for n in graph.nodes if n.name == buf)
    scale_loads = [ld for ld in ir.loads(padded.data.body) if ld.buf == "arg3"]
    assert scale_loads and all(ld.mask is None for ld in scale_loads)  # a scalar load takes no block mask
    prepare(graph, DEFAULT, "cuda")
    externs = [n for n in graph.nodes if getattr(n, "op", None) is not None and n.name != buf]
    dx, dw = externs
    assert isinstance(dx.op, templates.PaddedMatmul) and dx.args[0].layout.size[-1] == 1152
    assert not isinstance(dw.op, templates.PaddedMatmul) and tuple(dw.args[0].layout.stride) == (1, 1152)
    d = inputs[0] * inputs[3] + 1
    wide = torch.zeros(2048, 1152, dtype=torch.float16)
    wide[:, :1101] = d
    torch.testing.assert_close(dx.op(wide.float(), inputs[1].float()), d.float() @ inputs[1].float())


def test_padded_matmul_pads_b_to_a_wider_k():
    a = torch.zeros(5, 16)
    a[:, :13] = torch.randn(5, 13)
    b = torch.randn(13, 6)
    torch.testing.assert_close(templates.PaddedMatmul("mm", 8)(a, b), a[:, :13] @ b)


@pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda",
                    reason="needs a CUDA device (KILN_TRITON_TEST_DEVICE=cuda)")
def test_zero_padded_operands_on_gpu():
    fn, inputs, _ = _logits_grad_graph(pad=True)
    inputs = [t.cuda() for t in inputs]
    compiled = compile_aten_graph(trace(fn, *inputs), inputs, DEFAULT)
    assert "fallback" not in compiled.artefacts
    assert "(2048, 1152)" in compiled.artefacts["wrapper.py"], compiled.artefacts["wrapper.py"]
    assert_same(compiled(*inputs), fn(*inputs))

    def also_returned(dl, w, x, scale):  # the padded operand returned too: with eager's strides
        d = dl * scale + 1
        return d @ w, d.t() @ x, d

    compiled = compile_aten_graph(trace(also_returned, *inputs), inputs, DEFAULT)
    out = compiled(*inputs)
    assert_same(out, also_returned(*inputs))
    assert out[2].stride() == (1101, 1)


@pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda",
                    reason="needs a CUDA device (KILN_TRITON_TEST_DEVICE=cuda)")
def test_template_and_padding_on_gpu():
    half = torch.float16
    x, w, b = randn(100, 250, dtype=half), randn(130, 250, dtype=half), randn(130, dtype=half)
    fn = lambda x, w, b: F.relu(F.linear(x, w, b))  # noqa: E731
    for kind in ("template", "aten"):
        call, sched, ns, _ = build(fn, [x, w, b], MAX, prefer(kind))
        assert template_groups(sched)
        assert_same(call(x, w, b), fn(x, w, b))


# ----------------------------------------------------------------------------- end to end, default mode


class SmallCNN(torch.nn.Module):
    """The benchmark's tutorial CNN, shrunk: convolutions with biases, ReLU, max-pooling, two Linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Conv2d(4, 8, 3, padding=1)
        self.fc1, self.fc2 = torch.nn.Linear(8 * 2 * 2, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def test_small_cnn_trains_like_eager_with_templates_and_biases_apart(monkeypatch, compiled_graphs):
    """Default mode on the Triton target: the Linear layers' matmuls are templates in the forward and the
    backward, the convolutions run without their biases (added and summed in kernels), gradients equal eager's."""
    monkeypatch.setenv("KILN_CPU_BACKEND", "triton")
    torch.manual_seed(0)
    model = SmallCNN().to(DEVICE)
    reference = copy.deepcopy(model)
    x, y = randn(3, 1, 8, 8), torch.tensor([0, 2, 1], device=DEVICE)
    F.cross_entropy(kiln.compile(model)(x), y).backward()
    F.cross_entropy(reference(x), y).backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5)
    wrappers = {g.artefacts["name"]: g.artefacts["wrapper.py"] for g in compiled_graphs}
    forward, backward = (next(w for n, w in wrappers.items() if n.endswith(kind)) for kind in ("forward", "backward"))
    assert "fused_mm" in forward and "torch.addmm" not in backward and "torch.mm" not in backward
    assert "torch.convolution(arg" in forward and ", None, [1, 1]" in forward  # no bias in the ATen call
    assert backward.count("convolution_backward") == 2 and "True, True, True]" not in backward


@pytest.mark.parametrize("transposed", ["a", "b", "both"])
def test_padded_matmul_pads_an_operand_in_its_own_memory_order(transposed):
    """A transposed operand (a tied LM head reads `embedding.T`) is padded into a tensor of the same memory
    order, so the padding copy reads and writes in one order; the product is aten's."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 13, generator=g), torch.randn(13, 1001, generator=g)
    if transposed in ("a", "both"):
        a = a.t().contiguous().t()
    if transposed in ("b", "both"):
        b = b.t().contiguous().t()
    padded = templates._pad_dim(b, -1, 8)
    assert padded.shape == (13, 1008) and (padded.stride(0) == 1) == (transposed != "a")
    assert padded[:, 1001:].eq(0).all()
    torch.testing.assert_close(templates.PaddedMatmul("mm", 8)(a, b), a @ b)

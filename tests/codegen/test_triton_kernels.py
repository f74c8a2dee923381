"""The Triton target: generated kernels compared with eager, on the CPU through Triton's interpreter.

TRITON_INTERPRET=1 must be set before triton is imported (it decides at @triton.jit
time whether a kernel is compiled or interpreted), so it is set at the top of this
module, on machines without a GPU only (on a GPU machine it would make every CUDA test
collected alongside interpret its kernels). The interpreter is slow: shapes are small, but big enough for tails (sizes
that are not a power of two) and for looped reductions (rows past the persistent limit).

Every kernel is also compiled for an H100 (sm_90, tests/support/triton_sm90.py) without running it: the
interpreter accepts code that Triton's compiler rejects.

On a GPU the same tests run the kernels for real:
    KILN_TRITON_TEST_DEVICE=cuda python -m pytest tests/codegen/test_triton_kernels.py

The reduction matrices (op x kernel kind, dtype x kernel kind) run a sample in CI, every kind of kernel and
of reduction (plain, Welford's, arg-) kept; `KILN_TRITON_SWEEP=1` (or KILN_FULL_TESTS=1) runs all of them.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

from support.sweeps import full
from support.triton_device import DEVICE, skip_module_unless_kernels_run

skip_module_unless_kernels_run()

import kiln  # noqa: E402
from kiln.codegen.triton.heuristics import COLUMN_SPLIT_PROGRAMS, PERSISTENT_MAX_RBLOCK  # noqa: E402
from kiln.pipeline import compile_aten_graph  # noqa: E402
from support.lowering import assert_same, trace  # noqa: E402
from support.triton_sm90 import assert_compiles_for_sm90, recording_builds  # noqa: E402

TRITON = {"cpu_backend": "triton"}
LOOPED = PERSISTENT_MAX_RBLOCK + 37  # a row too long for one block: the reduction loops


def on_device(inputs):
    return [x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs]


def compile_triton(fn, *inputs, mode="real", options=None):
    inputs = on_device(inputs)
    gm = trace(fn, *inputs, mode=mode)
    with recording_builds() as builds:
        compiled = compile_aten_graph(gm, list(inputs), dict(TRITON, **(options or {})))
    assert_compiles_for_sm90(builds)
    assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
    assert "kernels.py" in compiled.artefacts
    return compiled


def check(fn, *inputs, max_kernels=None):
    inputs = on_device(inputs)
    compiled = compile_triton(fn, *inputs)
    with torch.no_grad():
        assert_same(compiled(*inputs), fn(*inputs))
    if max_kernels is not None:
        assert compiled.num_kernels <= max_kernels, compiled.artefacts["kernels.py"]
    return compiled


def source(compiled) -> str:
    return compiled.artefacts["kernels.py"]


# ----------------------------------------------------------------------------- pointwise


def test_pointwise_chain_is_one_masked_kernel():
    x, y = torch.randn(7, 13), torch.randn(7, 13)
    c = check(lambda x, y: ((x * 2).relu() + y.sigmoid()).tanh() - torch.exp(-x.abs()) / (1 + y * y), x, y,
              max_kernels=1)
    src = source(c)
    assert "@triton.jit" in src and "xmask" in src and "tl.store" in src


def test_unary_math_ops():
    x = torch.randn(5, 11)
    check(lambda x: torch.erf(x) + torch.log1p(x.abs()) + torch.expm1(x) * torch.rsqrt(x.abs() + 1)
          + torch.floor(x) + torch.round(x * 3) + torch.atan2(x, x + 2) + torch.sign(x), x, max_kernels=1)


def test_broadcasting():
    a, b, c = torch.randn(4, 1, 6), torch.randn(5, 1), torch.randn(6)
    check(lambda a, b, c: a * b + c - 1.5, a, b, c, max_kernels=1)


def test_scalar_tensor_broadcast():
    x, s = torch.randn(3, 9), torch.tensor(2.5)
    check(lambda x, s: x * s + s, x, s)


def test_non_contiguous_views():
    x = torch.randn(6, 10)
    check(lambda x: x.t() * 2 + 1, x)
    check(lambda x: x[:, ::2] * x[:, 1::2] + x[1:4, 3:8].sum(), x)
    check(lambda x: x.view(3, 2, 10).permute(2, 0, 1).sin(), x)
    check(lambda x: x[2:].reshape(20, 2).cos() + x[:1, :2], x)


def test_transposing_kernels_run_on_tiles_with_tails():
    """A kernel whose loads walk memory along another dim than its stores (attention's K^T written for a
    bmm, a cast through a permute) runs on 2-d tiles: read coalesced along one dim, written along the
    other. Sizes that are not multiples of the tile exercise the masks; a broadcast operand reads one row."""
    k = torch.randn(2, 37, 3, 20).to(torch.bfloat16)  # [batch, seq, heads, dim], as a linear layer writes it
    c = check(lambda k: (k.permute(0, 2, 3, 1).float() * 0.125).contiguous(), k, max_kernels=1)
    src = source(c)
    assert "tiled kernel over" in src and "rindex" in src and "mask = xmask & rmask" in src, src
    x, bias = torch.randn(24, 40), torch.randn(24, 1)
    c = check(lambda x, b: (x.t() + b.t()).contiguous(), x, bias, max_kernels=1)
    assert "tiled kernel over" in source(c)
    # a plain (non-transposing) pointwise kernel keeps its 1-d blocks
    assert "tiled" not in source(check(lambda x: x * 2 + 1, x))


def test_a_weight_copied_channels_last_reads_its_taps_as_one_dim_of_the_tile():
    """A 3x3 convolution weight stored channels-last ([O, I, 3, 3] -> O, 3, 3, I in memory): its two 3-long
    tap dims merge into one 9-long dim that the loads walk contiguously, and the tile's rows cover it."""
    w = torch.randn(20, 24, 3, 3)
    c = check(lambda w: w.contiguous(memory_format=torch.channels_last), w, max_kernels=1)
    src = source(c)
    assert "tiled kernel over outer (20, 9, 24)" in src and "RBLOCK=16" in src, src
    assert c(on_device([w])[0])[0].stride() == (216, 1, 72, 24)
    # max-autotune tries other tile widths, every one with rows covering the 9 taps whole
    tuned = source(compile_triton(lambda w: w.contiguous(memory_format=torch.channels_last), w,
                                  options={"max_autotune": True}))
    tiles = re.findall(r"'tiled XBLOCK=(\d+) RBLOCK=(\d+)", tuned)
    assert len(tiles) >= 3 and {r for _, r in tiles} == {"16"}, tuned


def test_non_contiguous_input():
    x = torch.randn(8, 6).t()[1:]
    check(lambda x: x.exp() * 3, x)


def test_int64_pointwise_floordiv_mod_with_negatives():
    x = torch.randint(-20, 20, (5, 7))
    y = torch.randint(1, 6, (5, 7)) * torch.where(torch.rand(5, 7) > 0.5, 1, -1)
    check(lambda x, y: (torch.div(x, y, rounding_mode="floor"), x % y, torch.remainder(x, 3), x * y - 4,
                        torch.div(x, y, rounding_mode="trunc")), x, y)


def test_an_integer_operand_out_of_the_tensors_range_wraps_as_in_eager():
    """`int32 + (1 << 40)` adds the operand as int32 holds it (0), as eager converts it; Triton refused the literal
    out of int32's range (fuzz seed 446164 on the Triton target)."""
    b = torch.tensor([1, -5, 7], dtype=torch.int32)
    check(lambda b: (b + (1 << 40), b * (1 << 33) + 3, b + (1 << 31), b.to(torch.uint8) + 300), b)


def test_bool_and_where():
    x = torch.randn(6, 9)
    check(lambda x: torch.where((x > 0) & (x < 1), x, -x) + (x > 0.5).float(), x)
    check(lambda x: (x > 0).logical_not() | (x < -1), x)


def test_padding_masks_loads():
    x = torch.randn(3, 5)
    check(lambda x: F.pad(x, (2, 1, 1, 0), value=0.5) * 2, x)
    check(lambda x: torch.cat([x, x * 2], dim=1).relu(), x)


def test_a_masked_load_of_one_element_is_a_block():
    """A strided slice of two elements written into its base, then read where the write's mask holds: the element
    read is at a constant index, under a mask over the loop, and Triton takes no scalar pointer under a block
    mask (fuzz seed 442352: the kernel raised on the GPU, and in the interpreter)."""
    def write_into_every_other(b):
        t0 = b * 1.5
        t2 = t0[..., ::2].mul_(2)
        return t2 * 1, t0 * 1.5 + 0.5

    b = torch.randn(2, device=DEVICE)
    with recording_builds() as builds:
        got = kiln.compile(write_into_every_other, options=TRITON)(b)
    assert_compiles_for_sm90(builds)
    assert_same(got, write_into_every_other(b))


# ----------------------------------------------------------------------------- reductions


ROW_OPS = ["sum", "amax", "amin", "argmax", "argmin", "mean", "var", "prod"]
# a looped row costs the interpreter seconds: CI loops one reduction of each kind (plain, arg-, Welford's)
LOOPED_IN_CI = ["sum", "argmax", "var"]


@pytest.mark.parametrize("op, n", [
    pytest.param(op, n, id=f"{op}-{kind}") for kind, n in (("persistent", 19), ("looped", LOOPED)) for op in ROW_OPS
    if kind == "persistent" or op in LOOPED_IN_CI or full("KILN_TRITON_SWEEP")])
def test_row_reductions(op, n):
    x = torch.randn(3, n)  # fewer rows than a block holds (masked); a looped row is one program each
    if op == "prod":
        x = 1 + x * 0.01
    fn = {
        "sum": lambda x: x.sum(-1), "amax": lambda x: x.amax(-1), "amin": lambda x: x.amin(-1),
        "argmax": lambda x: x.argmax(-1), "argmin": lambda x: x.argmin(-1), "mean": lambda x: x.mean(-1),
        "var": lambda x: x.var(-1), "prod": lambda x: x.prod(-1),
    }[op]
    c = check(fn, x)
    kind = "persistent" if n < PERSISTENT_MAX_RBLOCK else "looped"
    assert f"{kind} kernel" in source(c), source(c)
    if kind == "looped":
        assert "for roffset in range(0, rnumel, RBLOCK)" in source(c)


@pytest.mark.parametrize("shape", [(33, 7), (1300, 3)], ids=["persistent", "looped"])
def test_column_reductions(shape):
    x = torch.randn(*shape)
    check(lambda x: (x.sum(0), x.amax(0), x.argmax(0), x.var(0, correction=0)), x)


@pytest.mark.parametrize("rows", [8, 1300, 9000], ids=["persistent", "looped", "split"])
def test_a_column_sum_stores_and_sums_its_producer_in_one_kernel(rows):
    # relu's backward, read by matmuls, and its column sum (a bias gradient): the kernel walks the
    # columns, storing each value and adding it to its column's sum
    def relu_backward_and_bias_gradient(x, grad):
        masked = torch.where(x <= 0, 0.0, grad)
        return masked, masked.sum(0)

    x, grad = torch.randn(rows, 24), torch.randn(rows, 24)
    c = check(relu_backward_and_bias_gradient, x, grad, max_kernels=1)
    if rows == 9000:
        assert "split reduction" in source(c), source(c)


def test_full_reductions():
    x = torch.randn(40, 33)
    check(lambda x: (x.sum(), x.amax(), x.mean(), x.argmin()), x)


@pytest.mark.parametrize("shape", [(2, 0), (0, 3), (3, 0, 4)])
def test_kernels_over_a_dim_of_size_zero_compile_for_the_gpu(shape):
    """A reduction of an empty tensor (the sum is 0) and pointwise ops over it: every lane is masked, but the
    flat index split into dims divided by the zero size, which Triton's compiler folds and fails on (fuzz seed
    442933: its kernel fell back to ATen on the GPU)."""
    x = torch.randn(shape)
    check(lambda x: (x.sum(), (x * 1.5).exp(), x.sum(-1)), x)


def test_a_reduction_over_an_empty_dim_reads_nothing():
    """The column means of no rows plus a bias: each sum over the empty dim is 0, its mean NaN. The kernel read
    the bias and the empty matrix at a constant index, unmasked (fuzz seed 445128: a segfault under the
    interpreter, a read past the buffer on the GPU); such a reduction is its identity, and reads nothing."""
    x, bias = torch.randn(0, 3), torch.randn(3)
    compiled = check(lambda x, bias: ((x + bias).mean(0), (x * bias).prod(0), (x > bias).any(0),
                                      torch.var_mean(x + bias, 0)), x, bias)
    assert "tl.load" not in source(compiled), source(compiled)


def test_argmax_first_index_on_ties_and_nan_is_max():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, float("nan"), 5.0, float("nan")], [-1.0, -1.0, -1.0, -1.0]])
    check(lambda x: (x.argmax(-1), x.argmin(-1), x.amax(-1)), x)
    x = torch.randn(3, LOOPED)
    x[:, 100] = 10
    x[:, LOOPED - 3] = 10
    check(lambda x: x.argmax(-1), x)


def test_reduction_epilogue_and_prologue():
    x = torch.randn(6, 50)
    check(lambda x: ((x * 2).exp().sum(-1, keepdim=True) + 1).log(), x, max_kernels=1)


def test_int64_reductions():
    x = torch.randint(-100, 100, (4, 37))
    check(lambda x: (x.sum(-1), x.amax(-1), x.argmax(-1), x.amin(0)), x)


# ----------------------------------------------------------------------------- fused normalizations


@pytest.mark.parametrize("n", [33, LOOPED], ids=["persistent", "looped"])
def test_softmax_fuses(n):
    x = torch.randn(4, n)
    check(lambda x: torch.softmax(x, -1), x, max_kernels=2)
    check(lambda x: torch.log_softmax(x, -1), x, max_kernels=2)


@pytest.mark.parametrize("n", [48, LOOPED], ids=["persistent", "looped"])
def test_layernorm_fuses(n):
    x, w, b = torch.randn(3, n), torch.randn(n), torch.randn(n)
    check(lambda x, w, b: F.layer_norm(x, (n,), w, b, eps=1e-5), x, w, b, max_kernels=2)


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_dtypes_pointwise_and_reduction(dtype):
    if dtype.is_floating_point:
        x = torch.randn(6, 21).to(dtype)
        fn = lambda x: (x * 1.5 + x.abs(), x.sum(-1), x.amax(-1), x.softmax(-1))  # noqa: E731
    else:
        x = torch.randint(-50, 50, (6, 21), dtype=dtype)
        fn = lambda x: (x * 3 + x.abs(), x.sum(-1), x.amax(-1), x.argmax(-1))  # noqa: E731
    check(fn, x)


def test_bf16_layernorm_computes_in_float32():
    x, w = torch.randn(4, 40, dtype=torch.bfloat16), torch.randn(40, dtype=torch.bfloat16)
    c = check(lambda x, w: F.layer_norm(x, (40,), w, None), x, w)
    assert "tl.float32" in source(c)


def test_mixed_dtype_casts():
    x = torch.randn(5, 8)
    check(lambda x: (x.to(torch.bfloat16) * 3).float() + x.to(torch.int64) + (x > 0).to(torch.int32), x)


# ----------------------------------------------------------------------------- sizes and caching


def test_symbolic_sizes_are_kernel_arguments():
    x = torch.randn(6, 10)
    c = compile_triton(lambda x: (x - x.mean(-1, keepdim=True)).relu() * x.shape[0], x, mode="symbolic")
    src = source(c)
    assert "def triton_" in src and ", s" in src, src
    for shape in [(6, 10), (3, 17), (9, LOOPED)]:
        y = torch.randn(*shape, device=DEVICE)
        torch.testing.assert_close(c(y)[0], (y - y.mean(-1, keepdim=True)).relu() * shape[0])


def test_kernel_module_cached_on_disk(tmp_path, monkeypatch):
    from kiln.codegen import triton as triton_target

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    x = torch.randn(3, 5)
    c = compile_triton(lambda x: x.cos() * 2 + 0.125, x)
    files = list((tmp_path / "triton").rglob("*.py"))
    assert len(files) == 1 and files[0].read_text() == source(c)
    before = dict(triton_target.stats)
    compile_triton(lambda x: x.cos() * 2 + 0.125, x)
    assert triton_target.stats["memory_hits"] == before["memory_hits"] + 1


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU target selection")
def test_cpu_graphs_use_cpp_unless_forced():
    from kiln.codegen.target import select_target

    gm = trace(lambda x: x + 1, torch.randn(3))
    assert select_target(gm, [torch.randn(3)]).name == "cpp"
    assert select_target(gm, [torch.randn(3)], cpu_backend="triton").name == "triton"


# ----------------------------------------------------------------------------- launching


def test_launcher_checks_the_alignment_of_graph_inputs_only():
    """Fresh buffers are always 16-byte aligned: only graph inputs (a user's slice) are checked per call."""
    x = torch.randn(64)
    c = check(lambda x: (x.sin() * 2).sum() + x.cos(), x)
    launchers = [line for line in source(c).splitlines() if "= Launcher(" in line]
    assert launchers and all("check_alignment=" in line for line in launchers), launchers
    reads_input_only = [line for line in launchers if "check_alignment=(0,)" in line]
    assert reads_input_only, launchers


@pytest.mark.skipif(DEVICE != "cuda", reason="CPU and CUDA tensors mix only on a GPU")
def test_a_kernel_reads_a_cpu_scalar_input_of_a_cuda_graph_through_a_copy():
    """Eager multiplies a CUDA tensor by a CPU 0-dim tensor; launchers pass raw device addresses, so a kernel
    must never read the CPU one: it reads a copy the graph makes on the GPU (kiln/lower/host_work.py)."""
    fn = lambda x, s: x * s + 1  # noqa: E731
    x, s = torch.randn(64, device=DEVICE), torch.tensor(3.0)
    compiled = compile_aten_graph(trace(fn, x, s), [x, s], TRITON)
    assert "fallback" not in compiled.artefacts, compiled.artefacts["fallback"]
    assert_same(compiled(x, s), fn(x, s))
    assert s.device.type == "cpu"  # the caller's tensor is left where it was


@pytest.mark.skipif(DEVICE != "cuda", reason="CPU and CUDA tensors mix only on a GPU")
def test_a_cpu_constant_made_inside_a_cuda_graph_stays_on_the_cpu():
    """`torch.zeros(n)` with no device is a CPU tensor in eager, also in a graph whose inputs are on CUDA: the
    graph makes it with an ATen call on the CPU (kiln/lower/host_work.py), its GPU work in kernels."""
    fn = lambda x: (torch.zeros(3), x + 1)  # noqa: E731
    x = torch.randn(8, device=DEVICE)
    compiled = compile_aten_graph(trace(fn, x), [x], TRITON)
    assert "fallback" not in compiled.artefacts, compiled.artefacts["fallback"]
    assert compiled.num_kernels == 1
    got = compiled(x)
    assert got[0].device.type == "cpu"
    assert_same(got, fn(x))


@pytest.mark.skipif(DEVICE != "cuda", reason="CPU and CUDA tensors mix only on a GPU")
def test_a_cpu_scalar_made_and_used_inside_a_cuda_graph_is_generated():
    """A 0-d CPU tensor made inside and only used with CUDA tensors (a scale, as attention code makes one):
    eager allows the mix, and the graph compiles on the GPU."""
    fn = lambda x: x * torch.sqrt(torch.tensor(16.0)) + 1  # noqa: E731
    x = torch.randn(8, device=DEVICE)
    compiled = compile_aten_graph(trace(fn, x), [x], TRITON)
    assert "fallback" not in compiled.artefacts, compiled.artefacts["fallback"]
    assert_same(compiled(x), fn(x))


def test_input_at_an_unaligned_address_after_aligned_calls():
    """A kernel specialized for aligned inputs, then called with a slice 4 bytes into its storage: the
    launcher's fast path must not take it (misaligned vector loads), and the result must match eager."""
    fn = lambda x, y: x * 2 + y  # noqa: E731
    base, y = torch.randn(1025, device=DEVICE), torch.randn(1024, device=DEVICE)
    compiled = compile_triton(fn, base[:1024], y)
    for x in (base[:1024], base[1:], base[:1024]):
        assert_same(compiled(x, y), fn(x, y))


# ----------------------------------------------------------------------------- gathers


def test_embedding_and_index_select_gather():
    w, idx = torch.randn(11, 6), torch.tensor([[0, 3, 10], [7, 7, 1]])
    check(lambda w, idx: F.embedding(idx, w) * 2, w, idx)
    check(lambda w, idx: torch.index_select(w, 0, idx[0]).sum(-1), w, idx)
    check(lambda w, idx: w[idx[1], 1:4] + 1, w, idx)


# ----------------------------------------------------------------------------- split reductions


# a few rows this long split: a long row loops in blocks of 2048 and a split's chunks take two blocks at least, so
# rows past 8192 are the shortest that split (the interpreter's argmax and Welford walk every element)
SPLIT_COLUMNS = 8200


@pytest.mark.parametrize("op", ["sum", "amax", "argmax", "mean", "var"])
def test_split_reduction_of_few_long_rows(op):
    x = torch.randn(2, SPLIT_COLUMNS)
    fn = {"sum": lambda x: x.sum(-1), "amax": lambda x: x.amax(-1), "argmax": lambda x: x.argmax(-1),
          "mean": lambda x: x.mean(-1), "var": lambda x: x.var(-1)}[op]
    c = check(fn, x)
    assert "split reduction" in source(c) and "_partial" in source(c), source(c)


VARIANCE_KINDS = {"persistent": 19, "looped": LOOPED, "split": SPLIT_COLUMNS}
# CI: both dtypes persistent, and each of the other kinds in one dtype
VARIANCE_IN_CI = [(torch.float64, "persistent"), (torch.bfloat16, "persistent"), (torch.float64, "looped"),
                  (torch.bfloat16, "split")]


@pytest.mark.parametrize("dtype, cols", [
    pytest.param(dtype, cols, id=f"{dtype}-{kind}") for dtype in (torch.float64, torch.bfloat16)
    for kind, cols in VARIANCE_KINDS.items() if (dtype, kind) in VARIANCE_IN_CI or full("KILN_TRITON_SWEEP")])
def test_variance_accumulates_in_its_dtype(dtype, cols):
    """Welford's running mean, M2 and count are in the body's compute type: a float64 variance's float32
    accumulators lose its precision, and Triton's compiler rejects a loop that widens them to float64."""
    x = torch.randn(2, cols).to(dtype) * 100 + 1e4
    check(lambda x: torch.var_mean(x, -1), x)


def test_split_full_and_column_and_batchnorm_style_reductions():
    # seeded: the split adds its partial sums in another order than eager, and a sum of 27000 random values that
    # cancels to ~0.2 can then differ by more than float32's tolerance for some draws (one did in CI's command)
    x = torch.randn(9000, 3, generator=torch.Generator().manual_seed(0))
    c = check(lambda x: (x.sum(0), x.amin(0), x.sum()), x)
    assert "split reduction" in source(c)
    y = torch.randn(2, 3, 58, 71, generator=torch.Generator().manual_seed(0))  # 8236 a channel: still split
    c = check(lambda y: torch.var_mean(y, (0, 2, 3), correction=0), y)
    assert "split reduction" in source(c)


def test_batch_norm_statistics_over_many_channels_split_their_rows():
    # 256 channels of 2 x 128 x 128 values: one program per channel would leave most of a GPU idle, so
    # each channel's sum and Welford statistics are computed in chunks and combined. The interpreter takes
    # minutes over these 8M values, so on the CPU the kernels are only generated (the split kernels' results
    # are checked at smaller sizes above, Welford's included); on a GPU they run and are compared with eager.
    statistics = lambda x: (x.sum((0, 2, 3)), torch.var_mean(x, (0, 2, 3), correction=0))  # noqa: E731
    x = on_device([torch.randn(2, 256, 128, 128, generator=torch.Generator().manual_seed(0))])[0]
    c = compile_triton(statistics, x)
    assert "split reduction over outer (256)" in source(c), source(c)
    if DEVICE == "cuda":  # a sum of 32768 values in another order: off by float32 rounding of its terms (~1e-5)
        for got, expected in zip(tree_flatten(c(x))[0], tree_flatten(statistics(x))[0]):
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)
    # 64 x 64 images: rows of 8192 values stay one program each (a split would cost a launch and a workspace)
    short = compile_triton(statistics, torch.randn(2, 256, 64, 64))
    assert "split reduction" not in source(short), source(short)


def test_channels_last_batch_norm_statistics_split_as_many_programs_as_nchw():
    """Channels-last, a batch norm's statistics are column reductions (the channels contiguous, N*H*W values
    each): the columns split to about COLUMN_SPLIT_PROGRAMS programs, as long NCHW rows split to about
    ROW_SPLIT_PROGRAMS (the statistics of a channels-last training step, kiln/lower/conv_layout)."""
    x = torch.randn(2, 256, 128, 128).contiguous(memory_format=torch.channels_last)
    c = compile_triton(lambda x: torch.var_mean(x, (0, 2, 3), correction=0), x)
    partial = next(line for line in source(c).splitlines() if "_partial = Launcher(" in line)
    xblock, rsplit = (int(re.search(rf"{k}=(\d+)", partial).group(1)) for k in ("XBLOCK", "RSPLIT"))
    assert 256 // xblock * rsplit >= COLUMN_SPLIT_PROGRAMS // 2, partial


def test_reduction_read_back_by_its_row_is_not_split():
    x, w = torch.randn(2, SPLIT_COLUMNS), torch.randn(SPLIT_COLUMNS)
    c = check(lambda x, w: F.layer_norm(x, (SPLIT_COLUMNS,), w), x, w, max_kernels=2)
    assert "split reduction" not in source(c)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_exp_sigmoid_and_divisions_compile_in_every_float_dtype(dtype):
    """The kernels' exp, sigmoid and divisions call libdevice (eager's CUDA math, codegen/triton/ops.py), which has
    no float64 function of a float32 operand: a literal operand (`x / 3.0`, sigmoid's and reciprocal's 1) is made
    in the value's dtype (GPU fuzz seeds 520011 and 520360: float64 kernels failed to build and fell back)."""
    x = torch.randn(33, generator=torch.Generator().manual_seed(0), dtype=dtype)
    check(lambda x: (x.sigmoid(), x.reciprocal(), x / 3.0, 3.0 / x, x.exp() / (x + 2),
                     torch.atan2(x, torch.tensor(2.0, dtype=dtype))), x)

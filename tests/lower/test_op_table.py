"""The op table: each lowered op x dtype x shape, compiled by kiln and compared with eager.

Many ops share one compiled graph (one per dtype x shape case) to keep the C++
builds few; every case also asserts that nothing ran as an extern, so an op
that silently stopped being lowered fails here.
"""
from __future__ import annotations

import pytest
import torch

from support.lowering import check, count_externs
from support.threads import torch_threads

FLOAT_UNARY = {
    "exp": torch.exp, "log": lambda a: torch.log(a.abs() + 0.5), "sqrt": lambda a: torch.sqrt(a.abs()),
    "rsqrt": lambda a: torch.rsqrt(a.abs() + 0.5), "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "erf": torch.erf, "sin": torch.sin, "cos": torch.cos, "neg": torch.neg, "abs": torch.abs,
    "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "trunc": torch.trunc, "reciprocal": lambda a: torch.reciprocal(a.abs() + 0.5), "relu": torch.relu,
    "expm1": torch.expm1, "log1p": lambda a: torch.log1p(a.abs()), "isnan": torch.isnan,
    "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu, "square": torch.square,
    "clamp": lambda a: a.clamp(-0.5, 0.5), "to_int": lambda a: (a * 4).to(torch.int64),
    "to_bool": lambda a: a.round().bool(), "atan": torch.atan, "lgamma": lambda a: torch.lgamma(a * 3),
    "digamma": lambda a: torch.digamma(a * 3), "trigamma": lambda a: torch.polygamma(1, a * 3),
    "round_decimals": lambda a: torch.round(a * 50, decimals=1),
    "round_decimals_neg": lambda a: torch.round(a * 500, decimals=-2),
    "neg_view": lambda a: a._neg_view() * 2,  # a lazily negated view, read for its (negated) values
}
FLOAT_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "where": lambda a, b: torch.where(a > 0, a, b),
    "pow2": lambda a, b: a ** 2, "pow3": lambda a, b: a ** 3, "pow": lambda a, b: (a.abs() + 0.5) ** b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=3),
    "scalar": lambda a, b: a * 2.5 - 1, "floordiv": lambda a, b: torch.div(a, b.abs() + 0.5, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b.abs() + 0.5, rounding_mode="trunc"),
    "remainder": lambda a, b: torch.remainder(a, b.abs() + 0.5), "atan2": torch.atan2,
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "masked_fill": lambda a, b: a.masked_fill(b > 0, -1.0),
    "copysign": torch.copysign, "copysign_scalar": lambda a, b: torch.copysign(a, -2.0), "hypot": torch.hypot,
    "fmax": lambda a, b: torch.fmax(a.masked_fill(a > 1, float("nan")), b),
    "fmin": lambda a, b: torch.fmin(a, b.masked_fill(b < 0, float("nan"))),
    "ldexp": lambda a, b: torch.ldexp(a, (b * 4).round()),
}
INT_UNARY = {"neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "bitwise_not": torch.bitwise_not,
             "to_float": lambda a: a.float(), "square": torch.square, "relu": torch.relu}
INT_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
    "eq": torch.eq, "lt": torch.lt, "ge": torch.ge, "where": lambda a, b: torch.where(a > 0, a, b),
    "floordiv": lambda a, b: torch.div(a, b.abs() + 1, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b.abs() + 1, rounding_mode="trunc"),
    "remainder": lambda a, b: torch.remainder(a, b.abs() + 1), "bitwise_and": torch.bitwise_and,
    "bitwise_xor": torch.bitwise_xor, "pow": lambda a, b: a ** 2, "scalar_float": lambda a, b: a * 0.5,
    "bitwise_scalar": lambda a, b: ((a & 3) | 8) ^ 5,
}
BOOL_OPS = {
    "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "not": lambda a, b: torch.logical_not(a), "bitwise_and": torch.bitwise_and, "eq": torch.eq,
    "where": lambda a, b: torch.where(a, 1.0, 2.0), "to_int": lambda a, b: a.to(torch.int64) + b,
}


HALF = (torch.bfloat16, torch.float16)  # computed in float, rounded after each op: ops at rounding ties left out


def _shapes():
    """(a, b) makers covering size-1 dims, broadcasting, non-contiguous and empty inputs."""
    return {
        "plain": lambda mk: (mk(4, 5), mk(4, 5)),
        "size1_broadcast": lambda mk: (mk(3, 1, 5), mk(4, 1)),
        "noncontig": lambda mk: (mk(5, 4).t(), mk(8, 5)[::2]),
        "empty": lambda mk: (mk(0, 5), mk(1, 5)),
        "scalar": lambda mk: (mk(), mk(3)),
    }


def _maker(dtype):
    g = torch.Generator().manual_seed(0)

    def mk(*size):
        if dtype.is_floating_point:
            return torch.randn(size, generator=g).to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, size, generator=g).bool()
        return torch.randint(-5, 6, size, generator=g).to(dtype)
    return mk


def _cases(dtype):
    if dtype.is_floating_point:
        return FLOAT_UNARY, FLOAT_BINARY
    if dtype == torch.bool:
        return {}, BOOL_OPS
    return INT_UNARY, INT_BINARY


@pytest.mark.sampled(every=2, classes=("dtype", "shape"))
@pytest.mark.parametrize("shape", list(_shapes()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.bool], ids=str)
def test_pointwise(dtype, shape):
    unary, binary = _cases(dtype)
    a, b = _shapes()[shape](_maker(dtype))
    if dtype in HALF:
        unary = {k: v for k, v in unary.items()
                 if k not in ("round", "floor", "ceil", "trunc", "to_int", "to_bool", "sign", "round_decimals",
                              "round_decimals_neg")}
        binary = {k: v for k, v in binary.items() if k not in ("floordiv", "truncdiv", "remainder")}

    def fn(a, b):
        return tuple(f(a) for f in unary.values()) + tuple(f(a, b) for f in binary.values())

    compiled = check(fn, a, b)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


def test_bool_add_and_mul_are_logic_inside_a_fused_consumer():
    """True + True is True in eager: a float consumer fused after it must see 1, not 2."""
    a = torch.tensor([True, True, False, False])
    b = torch.tensor([True, False, True, False])

    def fn(a, b):
        return (a + b) / 1.0, (a * b) * 3.0, (a + b) + (a * b)

    check(fn, a, b)


REDUCTIONS = {
    "sum_last": lambda a: a.sum(-1), "sum_first_keep": lambda a: a.sum(0, keepdim=True),
    "sum_all": lambda a: a.sum(), "mean": lambda a: a.mean(-1), "amax": lambda a: a.amax(-1),
    "amin_all": lambda a: a.amin((0, 1)), "argmax": lambda a: a.argmax(-1), "argmin0": lambda a: a.argmin(0),
    "argmax_all": lambda a: a.argmax(), "max_dim": lambda a: a.max(1), "prod": lambda a: a.prod(-1),
    "var": lambda a: a.var(-1), "var_mean": lambda a: torch.var_mean(a, 0, correction=0),
    "std": lambda a: a.std(), "std_mean": lambda a: torch.std_mean(a, -1, keepdim=True),
    "any": lambda a: (a > 0.5).any(-1), "logsumexp": lambda a: a.logsumexp(-1),
    "softmax": lambda a: a.softmax(-1), "log_softmax0": lambda a: a.log_softmax(0),
    "norm": lambda a: a.norm(dim=-1), "max_all": lambda a: a.max(), "min_all": lambda a: a.min(),
}


@pytest.mark.sampled(every=2, classes=("dtype", "shape"))
@pytest.mark.parametrize("shape", [(6, 7), (1, 9), (5, 1), (3, 4, 5)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_reductions_float(dtype, shape):
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    cases = REDUCTIONS if dtype not in HALF else {
        k: v for k, v in REDUCTIONS.items() if k not in ("prod", "argmax", "argmin0", "argmax_all", "max_dim")}

    def fn(a):
        return tuple(f(a) for f in cases.values())

    compiled = check(fn, a)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool], ids=str)
def test_reductions_int(dtype):
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-3, 4, (5, 6), generator=g).to(dtype)

    def fn(a):
        outs = (a.sum(-1), a.sum(), a.any(0), a.amax(-1) if dtype != torch.bool else a.any(1),
                a.argmax(1).long() if dtype != torch.bool else a.sum(0))
        return outs + ((a.prod(0),) if dtype != torch.bool else ())

    compiled = check(fn, a)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


def test_reduction_of_empty():
    a = torch.randn(3, 0)
    check(lambda a: (a.sum(-1), a.sum(0), (a * 2).mean(0)), a)


def test_reductions_noncontiguous_and_large():
    g = torch.Generator().manual_seed(3)
    big = torch.randn(300, 257, generator=g)  # large enough for the parallel paths, run on two threads
    with torch_threads(2):
        check(lambda a: (a.t().sum(-1), a.sum(), a.amax(), a.argmax(), torch.var_mean(a), a.t().softmax(-1),
                         (a * a).sum(0)), big)


VIEWS = {
    "permute": lambda a: a.permute(2, 0, 1) * 2, "transpose": lambda a: a.transpose(0, 2) + 1,
    "view": lambda a: a.view(6, 5) + 1, "reshape_noncontig": lambda a: a.transpose(1, 2).reshape(2, 15) * 3,
    "flatten_lazy": lambda a: (a + 1).transpose(0, 1).reshape(-1) * 2,
    "expand": lambda a: a[:, :1].expand(2, 4, 5) + 1, "unsqueeze": lambda a: a.unsqueeze(1) - 1,
    "squeeze": lambda a: a[:, :1].squeeze(1) * 2, "slice_step": lambda a: a[:, ::2, 1:4] + 1,
    "select_neg": lambda a: a[-1, :, -2] * 2, "cat": lambda a: torch.cat([a, a * 2, a[:, :1]], 1),
    "cat_empty": lambda a: torch.cat([a[:, :0], a], 1) + 0, "diagonal": lambda a: a.diagonal(1, 1, 2) * 2,
    "pad": lambda a: torch.nn.functional.pad(a, (1, 2, 0, 1), value=3.0),
    "pad_neg": lambda a: torch.nn.functional.pad(a, (-1, 1)),
    "split": lambda a: tuple(t * 2 for t in a.split([2, 1], 1)),
    "unbind": lambda a: tuple(t + 1 for t in a.unbind(0)), "arange": lambda a: a + torch.arange(5),
    "full": lambda a: a + torch.full((3, 5), 2.0), "zeros_like": lambda a: torch.zeros_like(a) + a,
    "chunk_cat": lambda a: torch.cat(a.chunk(2, -1)[::-1], -1), "t_mm_input": lambda a: a[0].t() @ a[1],
    "flip": lambda a: a.flip(0, 2) + 1, "repeat": lambda a: a.repeat(2, 1, 2, 1) * 2,
    "unfold": lambda a: a.unfold(2, 2, 2) * 2, "unfold_overlapping": lambda a: a.unfold(1, 2, 1) + 1,
    "permute_copy": lambda a: torch.permute_copy(a, (2, 0, 1)), "view_copy": lambda a: torch.view_copy(a, (5, 6)),
    "select_copy": lambda a: torch.select_copy(a, 1, -1) * 2, "slice_copy": lambda a: torch.slice_copy(a, 2, 1, 4),
    "split_copy": lambda a: tuple(torch.split_copy(a, 2, 2)), "detach_copy": lambda a: torch.detach_copy(a) + 1,
    "slice_scatter_step": lambda a: torch.slice_scatter(a, a[:, ::2] * 2, 1, 0, None, 2),
    "slice_scatter_middle": lambda a: torch.slice_scatter(a, a[:, :, 1:3] + 1, 2, 1, 3),
    "diagonal_scatter": lambda a: torch.diagonal_scatter(a, a.diagonal(1, 1, 2) * 2, 1, 1, 2),
    "diagonal_scatter_below": lambda a: torch.diagonal_scatter(a, a.diagonal(-1, 2, 1) * 2, -1, 2, 1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_views(dtype):
    a = (torch.randn(2, 3, 5) * 4).to(dtype)
    cases = {k: v for k, v in VIEWS.items() if dtype.is_floating_point or k not in ("t_mm_input", "pad")}

    def fn(a):
        out = []
        for f in cases.values():
            r = f(a)
            out.extend(r if isinstance(r, tuple) else (r,))
        return tuple(out)

    compiled = check(fn, a)
    assert count_externs(compiled) == (1 if dtype.is_floating_point else 0), compiled.artefacts["schedule"]
    assert "buf" in str(compiled.artefacts["ir"])


def test_nextafter_steps_by_the_dtype_ulp():
    """nextafter is lowered in float32 and float64; a half type's step is its own ulp (float32's would round
    away), so there it stays an ATen call rather than a wrong kernel."""
    g = torch.Generator().manual_seed(4)
    for dtype, externs in ((torch.float32, 0), (torch.float64, 0), (torch.bfloat16, 2)):
        a, b = torch.randn(4, 5, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype)
        compiled = check(lambda a, b: (torch.nextafter(a, b), torch.nextafter(a, a)), a, b)
        assert count_externs(compiled) == externs, compiled.artefacts["schedule"]


def test_view_output_aliases_input():
    """A graph output that is a view of an input is returned as a view, not a copy."""
    a = torch.randn(4, 6)
    compiled = check(lambda a: (a.t(), a[1:3]), a)
    out = compiled(a)
    assert out[0].data_ptr() == a.data_ptr() and out[1].data_ptr() == a[1:3].data_ptr()


def test_gather_style_indexing():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(10, 6, generator=g)
    ids = torch.randint(0, 10, (3, 4), generator=g)
    x = torch.randn(5, 7, generator=g)
    col = torch.randint(0, 7, (5, 3), generator=g)
    rows = torch.tensor([4, -1, 0])

    def fn(w, ids, x, col, rows):
        return (torch.nn.functional.embedding(ids, w) * 2, torch.index_select(x, 1, col[0]) + 1,
                torch.gather(x, 1, col).sin(), x[rows] * 3, x[:, col[1]], x[rows, col[:3, 0]],
                torch.nn.functional.cross_entropy(x, col[:, 0]))

    compiled = check(fn, w, ids, x, col, rows)
    assert count_externs(compiled) == 0, compiled.artefacts["ir"]


def test_scatter_of_one_position_per_row_is_a_select():
    """`zeros.scatter(1, target[:, None], -1.0)` (cross-entropy's backward) lowers to a fused select,
    along either dim and over any base; a scatter of several positions per row (duplicates included: each
    writes the same value) is a dense `any` over the index (tests/lower/test_scatters.py)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 9, generator=g)
    rows = torch.randint(0, 9, (5, 1), generator=g)
    cols = torch.randint(0, 5, (1, 9), generator=g)

    def fn(x, rows, cols):
        return (torch.zeros_like(x).scatter(1, rows, -1.0) * 2, x.scatter(0, cols, 3.0) + 1,
                x.scatter(-1, rows, 0.5).sum(1))

    compiled = check(fn, x, rows, cols)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]
    two_per_row = torch.tensor([[0, 3], [8, 8], [1, 2], [4, 4], [0, 8]])
    compiled = check(lambda x, i: x.scatter(1, i, -1.0) * 2, x, two_per_row)
    assert count_externs(compiled) == 0


def test_cross_entropy_writes_no_vocabulary_sized_temporary():
    """The loss gathers from log_softmax without writing it; the gradient `onehot - softmax * sum(onehot)`
    recomputes the one-hot instead of storing it: the only [rows, classes] buffer is the gradient."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 300, generator=g)
    t = torch.randint(0, 300, (6,), generator=g)

    def fn(x, t, scale):
        logp = torch.log_softmax(x, 1)
        onehot = torch.zeros_like(x).scatter(1, t[:, None], -1.0) * scale
        return onehot - torch.exp(logp) * onehot.sum(1, keepdim=True), -logp.gather(1, t[:, None]).mean()

    compiled = check(fn, x, t, torch.tensor(0.5))
    wrapper = compiled.artefacts["wrapper.py"]
    assert wrapper.count("empty_strided((6, 300)") == 1, wrapper


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_casts_round_like_eager(dtype):
    """float32 -> half -> float32 bit for bit: ties to even, subnormals, overflow to inf, NaN and inf."""
    info = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), info.max, -info.max,
                            info.max * 1.0009765625, 70000.0, info.tiny, info.tiny / 3, info.tiny * 0.75,
                            info.smallest_normal / 1024 * 0.5, 1 + info.eps / 2, 1 + info.eps * 1.5, 1e-9])
    x = torch.cat([special, torch.randn(200, generator=torch.Generator().manual_seed(5)) * 300])
    compiled = check(lambda x: (x.to(dtype), x.to(dtype).float() * 2, (x.to(dtype) * x.to(dtype)).double()), x)
    out = compiled(x)[0]
    torch.testing.assert_close(out, x.to(dtype), rtol=0, atol=0, equal_nan=True)


def test_cast_read_by_a_matmul_and_returned_is_stored_once_in_memory_order():
    """A weight cast for a matmul and also returned (saved for the backward, in training) is one buffer
    with eager's layout, written in the order it is read; the matmul takes the transposed view of it."""
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(4, 6, generator=g), torch.randn(10, 6, generator=g)

    def fn(x, w):
        wb = w.to(torch.float64)
        return x.double() @ wb.t(), wb

    compiled = check(fn, x, w)
    wrapper = compiled.artefacts["wrapper.py"]
    assert wrapper.count("empty_strided((10, 6), (6, 1), dtype=torch.float64") == 1, wrapper
    assert "(6, 10)" not in wrapper.split("torch.mm")[0], wrapper  # no transposed copy


def test_result_with_permuted_strides_is_computed_in_memory_order():
    """An output whose eager strides are a permutation (`x.t() * 2` keeps the transposed layout) is a
    buffer iterated in memory order, viewed with eager's strides."""
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(10))
    compiled = check(lambda x: x.t() * 2 + 1, x)
    out = compiled(x)[0]
    assert out.stride() == (1, 7)
    ir = str(compiled.artefacts["ir"])
    assert "pointwise[5, 7]" in ir and "pointwise[7, 5]" not in ir, ir

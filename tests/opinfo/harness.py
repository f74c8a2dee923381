"""OpInfo conformance: every op of PyTorch's op database through kiln's code generator, compared with eager.

A *row* is one (op variant, dtype, target, fwd|bwd). Running a row compiles, for each of its sample
inputs, a function calling the op with `kiln.compile(..., dynamic=False)` (the default backend; `dynamic=True`
for the dynamic table, where sizes and int arguments are symbols) and compares what it returns (and, for
`bwd`, the gradients of its inputs) with eager. Its outcome is

- `pass`: every sample matched eager and ran through kiln's kernels;
- `fallback`: every sample matched, but some of the op ran through ATen where kiln meant to generate
  code (a graph that could not be compiled, an extern that is not one by design, a graph break or a
  capture that ran eagerly);
- `xfail`: some sample returned a wrong result or raised; the reason says which.

The anchor is Inductor's own `test/inductor/test_torchinductor_opinfo.py`: the same op database, the
same call (`op(sample.input, *sample.args, **sample.kwargs)`), one outcome per (op, dtype). Unlike it,
kiln keeps every outcome in a table (`outcomes.json`) rather than expected-failure lists in the test.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_map

import kiln
from kiln.lower import ir
from kiln.lower.ops import LOWERINGS
from kiln.pipeline import GRAPH_LISTENERS
from kiln.schedule.fusion import ExternStep
from support.time_limit import TimeLimitExceeded, time_limit

aten = torch.ops.aten

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}
GRAD_DTYPES = ("float32", "float64")
TARGETS = ("cpp", "triton")
MODES = ("fwd", "bwd")

# Ops whose results are random or uninitialized: nothing to compare. OpInfo flags the uninitialized ones
# (`has_nondeterministic_output`); the random ones it names only by their samplers.
RANDOM_OPS = frozenset({
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal", "normal.in_place",
    "normal.number_mean", "uniform", "rand_like", "randn", "randn_like", "randint", "randint_like",
    "nn.functional.rrelu", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
})

# Externs kiln runs through ATen by design, not fallbacks: calls into vendor libraries that do them better than
# generated loops (kiln/fallbacks.py: matmul, convolution, attention; and, as for Inductor, which never generates
# them either, FFTs (pocketfft, cuFFT) and the dense factorizations of LAPACK / cuSOLVER).
BY_DESIGN_EXTERNS = frozenset({
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._fft_r2c.default, aten._fft_c2c.default, aten._fft_c2r.default,
    aten._linalg_svd.default, aten._linalg_eigh.default, aten._linalg_slogdet.default, aten._linalg_det.default,
    aten.linalg_pinv.atol_rtol_tensor, aten.linalg_eig.default, aten.linalg_qr.default,
    aten.linalg_cholesky_ex.default, aten.linalg_lu_factor_ex.default, aten.linalg_lu.default,
    aten.linalg_inv_ex.default, aten._linalg_solve_ex.default, aten.linalg_ldl_factor_ex.default,
    aten.linalg_solve_triangular.default, aten.triangular_solve.default, aten.lu_unpack.default,
    aten.geqrf.default, aten.ormqr.default, aten.linalg_householder_product.default,
    aten.linalg_lu_solve.default, aten.cholesky.default, aten.cholesky_solve.default, aten.cholesky_inverse.default,
    aten._linalg_check_errors.default,  # raises on a factorization's error code
})




def touches_complex(node: ir.Extern) -> bool:
    """Does the extern read or write a complex tensor? kiln's code generators have no complex dtypes (as
    Inductor's C++ and Triton kernels have none): the complex steps around an FFT (`view_as_real`, a
    conjugate, a cast to complex) run through ATen by design, like the FFT itself."""
    refs = [a for a in tree_flatten((node.args, node.kwargs))[0] if hasattr(a, "layout")]
    dtypes = [r.layout.dtype for r in refs] + [getattr(out, "dtype", None) for out in tree_flatten(node.layout)[0]]
    return any(d is not None and d.is_complex for d in dtypes)


@dataclass(frozen=True)
class Row:
    op: str      # the OpInfo's name, with its variant (`max.reduction_with_dim`)
    dtype: str   # a key of DTYPES
    target: str  # "cpp" or "triton"
    mode: str    # "fwd" or "bwd"

    @property
    def key(self) -> str:
        return f"{self.op}|{self.dtype}|{self.target}|{self.mode}"

    @staticmethod
    def parse(key: str) -> Row:
        return Row(*key.split("|"))


def op_name(info) -> str:
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def op_db() -> dict:
    """The OpInfos to test, by name: the op database less the ops with random or uninitialized results."""
    from torch.testing._internal.common_methods_invocations import op_db as database

    # `has_nondeterministic_output` is absent from torch 2.11's OpInfo
    return {op_name(info): info for info in database
            if op_name(info) not in RANDOM_OPS and not getattr(info, "has_nondeterministic_output", False)}


def rows(ops: dict, targets=TARGETS, modes=MODES) -> list[Row]:
    """Every row of `ops`: each dtype of DTYPES the op supports on the CPU; `bwd` for differentiable ops
    in float32 and float64."""
    out = []
    for name, info in ops.items():
        supported = info.supported_dtypes("cpu")
        backward = info.supported_backward_dtypes("cpu") if info.supports_autograd else set()
        for dtype_name, dtype in DTYPES.items():
            if dtype not in supported:
                continue
            for target in targets:
                out.append(Row(name, dtype_name, target, "fwd"))
                if "bwd" in modes and dtype_name in GRAD_DTYPES and dtype in backward:
                    out.append(Row(name, dtype_name, target, "bwd"))
    return [r for r in out if r.mode in modes]


def samples(info, row: Row) -> list:
    """The row's sample inputs, the same on every run (OpInfo's samplers draw from the global generator)."""
    torch.manual_seed(0)
    return list(info.sample_inputs("cpu", DTYPES[row.dtype], requires_grad=row.mode == "bwd"))


@contextlib.contextmanager
def target(name: str):
    """Compile for `name`: the one place that selects the code generator's target for the CPU. The Triton
    target needs TRITON_INTERPRET=1 before triton is imported (tests/support/triton_device.py sets it)."""
    old = os.environ.get("KILN_CPU_BACKEND")
    os.environ["KILN_CPU_BACKEND"] = name
    try:
        yield
    finally:
        if old is None:
            del os.environ["KILN_CPU_BACKEND"]
        else:
            os.environ["KILN_CPU_BACKEND"] = old


class Observer:
    """What kiln did while one sample ran: the graphs it compiled, the lowering rules that generated
    code (which ATen overloads reached kiln's lowering), graph breaks and failed captures."""

    def __init__(self):
        self.graphs, self.lowered, self.breaks, self.eager_graphs = [], set(), [], []
        self.eager_graphs_handler = _ListHandler(self.eager_graphs, only="eagerly")

    @contextlib.contextmanager
    def watching(self):
        listener = lambda compiled, options: self.graphs.append(compiled)  # noqa: E731
        rules = dict(LOWERINGS)
        LOWERINGS.update({op: self._recording(op, rule) for op, rule in rules.items()})
        handler = _ListHandler(self.breaks)
        breaks = logging.getLogger("kiln.graph_breaks")
        hints = logging.getLogger("kiln.perf_hints")  # a graph the AOT stage runs op by op, eagerly
        level = breaks.level
        breaks.addHandler(handler)
        hints.addHandler(self.eager_graphs_handler)
        breaks.setLevel(logging.INFO)
        GRAPH_LISTENERS.append(listener)
        recorded = len(kiln.fallbacks.records())
        try:
            with warnings.catch_warnings():  # ops' own deprecation warnings; kiln's fallbacks are read below
                warnings.simplefilter("ignore")
                yield self
        finally:
            GRAPH_LISTENERS.remove(listener)
            breaks.removeHandler(handler)
            hints.removeHandler(self.eager_graphs_handler)
            breaks.setLevel(level)
            LOWERINGS.update(rules)
            # a graph the compile stage sent through ATen is read off its artefacts (`fallbacks`); every other
            # fallback, one the AOT stage took (the graph run op by op) included, is read here
            self.breaks += [f.describe() for f in kiln.fallbacks.records()[recorded:]
                            if not (f.kind == "graph" and f.stage == "compile")]

    def _recording(self, op, rule):
        def recorded(*args, **kwargs):
            out = rule(*args, **kwargs)  # raises Unsupported where the op becomes an extern instead
            self.lowered.add(str(op))
            return out
        return recorded

    def fallbacks(self) -> list[str]:
        """Why some of the sample ran through ATen, where kiln meant to generate code."""
        reasons = [f"graph fell back: {g.artefacts['fallback']}" for g in self.graphs if "fallback" in g.artefacts]
        for g in self.graphs:
            steps = getattr(g.artefacts.get("schedule"), "steps", [])
            externs = [s.node for s in steps if isinstance(s, ExternStep) and isinstance(s.node, ir.Extern)]
            reasons += [f"extern {node.op}" for node in externs
                        if node.op not in BY_DESIGN_EXTERNS and not touches_complex(node)]
        reasons += [f"graph ran eagerly: {m}" for m in self.eager_graphs]
        return reasons + [f"graph break: {b}" for b in self.breaks]


class _ListHandler(logging.Handler):
    """Keeps the messages of a kiln logger (those containing `only`, if given)."""

    def __init__(self, records: list, only: str = ""):
        super().__init__(logging.INFO)
        self.records, self.only = records, only

    def emit(self, record):
        message = record.getMessage()
        if self.only in message:
            self.records.append(message)


def clone(value):
    """A fresh copy of every tensor in `value` (ops may write their inputs), keeping requires_grad."""
    def copy(t):
        if not isinstance(t, torch.Tensor):
            return t
        c = t.detach().clone()
        return c.requires_grad_(t.requires_grad)
    return tree_map(copy, value)


def run_sample(info, sample, row: Row, dynamic: bool = False):
    """(eager result, kiln result, Observer) of one sample; each result is the outputs, plus for `bwd` the
    gradients of the inputs; an exception raised is the result."""
    op = info.get_op()

    def call(x, args, kwargs):
        return op(x, *args, **kwargs)

    eager = _evaluate(call, sample, row)
    kiln.reset()
    observer = Observer()
    cached, kiln.config.graph_cache = kiln.config.graph_cache, False  # a cached graph skips the lowering observed
    try:
        with target(row.target), observer.watching():
            compiled = _evaluate(kiln.compile(call, dynamic=dynamic), sample, row)
    finally:
        kiln.config.graph_cache = cached
    return eager, compiled, observer


def _evaluate(fn, sample, row: Row):
    inputs = clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
    try:
        out = fn(*inputs)
        if row.mode == "bwd":
            return out, _gradients(out, inputs)
        return out
    except TimeLimitExceeded:
        raise
    except Exception as e:
        return e


def _gradients(out, inputs) -> list:
    """The gradients of the inputs that require grad, for a cotangent of fixed values per output."""
    leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves or not outs:
        return []
    g = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(t.shape, generator=g).to(t.dtype) for t in outs]  # the same values in every dtype
    return list(torch.autograd.grad(outs, leaves, cotangents, allow_unused=True))


def mismatch(eager, got, reference: Callable[[], list | None]) -> str | None:
    """Why `got` differs from `eager`, or None. Both raising the same exception type is a match. A floating
    result outside the tolerance still matches where it is as close to the float64 `reference` (the leaves
    of the op run in float64) as eager's is: eager's own rounding differs from kiln's (fused ops round
    once, a C++ compiler contracts a*b+c), and near a singularity (asin's gradient at 1) either is amplified."""
    if isinstance(eager, Exception) or isinstance(got, Exception):
        if type(eager) is type(got):
            return None
        if isinstance(got, Exception):
            return f"error: {_describe(got)}"
        return f"wrong result: eager raised {type(eager).__name__}, kiln returned"
    eager_leaves, spec = tree_flatten(eager)
    got_leaves, got_spec = tree_flatten(got)
    if spec != got_spec:
        return f"wrong result: output structure {got_spec} != eager's {spec}"
    for k, (e, g) in enumerate(zip(eager_leaves, got_leaves)):
        why = _leaf_mismatch(e, g)
        if why and not _as_close_as_eager(e, g, k, reference):
            return f"wrong result: output {k}: {why}"
    return None


def _as_close_as_eager(e, g, k: int, reference: Callable[[], list | None]) -> bool:
    if not (isinstance(e, torch.Tensor) and e.is_floating_point() and g.dtype == e.dtype and g.shape == e.shape):
        return False
    leaves = reference()
    r = leaves[k] if leaves is not None and k < len(leaves) else None
    if not isinstance(r, torch.Tensor) or r.shape != e.shape:
        return False
    rtol, atol = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}.get(e.dtype, (1.6e-2, 1e-5))
    e, g, r = e.detach().double(), g.detach().double(), r.detach().double()
    allowed = 2 * (e - r).abs() + atol + rtol * r.abs()
    ok = (g == e) | (g.isnan() & e.isnan()) | ((g - r).abs() <= allowed)
    return bool(ok.all())


def reference(info, sample, row: Row) -> list | None:
    """The leaves of the sample's result (outputs, and for `bwd` gradients) computed in float64, or None."""
    def up(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.detach().double().requires_grad_(t.requires_grad)
        return t
    up_sample = type(sample)(up(sample.input), args=tree_map(up, tuple(sample.args)),
                             kwargs=tree_map(up, dict(sample.kwargs)))
    op = info.get_op()
    result = _evaluate(lambda x, args, kwargs: op(x, *args, **kwargs), up_sample, row)
    return None if isinstance(result, Exception) else tree_flatten(result)[0]


def _leaf_mismatch(e, g) -> str | None:
    if not isinstance(e, torch.Tensor):
        if isinstance(e, float) and isinstance(g, float) and math.isnan(e) and math.isnan(g):
            return None
        return None if type(e) is type(g) and e == g else f"{g!r} != eager's {e!r}"
    if not isinstance(g, torch.Tensor):
        return f"a {type(g).__name__} where eager returns a tensor"
    if g.dtype != e.dtype or g.shape != e.shape:
        return f"{g.dtype}{list(g.shape)} where eager returns {e.dtype}{list(e.shape)}"
    try:
        torch.testing.assert_close(g.detach(), e.detach(), equal_nan=True, check_device=False, **_tolerance(e.dtype))
    except AssertionError as err:
        return _short(err)
    return None


def _tolerance(dtype) -> dict:
    """assert_close's defaults, except in half precision: kiln computes in float32 and rounds once where
    eager rounds after every op, and rounds where eager's fused kernels do not (a convolution's bias is
    added after its result is rounded), so the two differ by a rounding or two of an intermediate, which
    a cancellation between the convolution and its bias leaves large beside a small result."""
    if dtype == torch.bfloat16:
        return {"atol": 3e-2, "rtol": 1.6e-2}
    if dtype == torch.float16:
        return {"atol": 3e-3, "rtol": 1e-3}
    return {}


def _describe(e: Exception) -> str:
    """`Type: message`, of the cause where kiln wraps one (BackendCompilerFailed names every option)."""
    cause = e.__cause__ if e.__cause__ is not None and type(e).__name__ == "BackendCompilerFailed" else None
    if cause is not None:
        return f"{type(e).__name__} <- {type(cause).__name__}: {_short(cause)}"
    return f"{type(e).__name__}: {_short(e)}"


def _short(e: Exception) -> str:
    text = re.sub(r" at /\S+| \(/\S+:\d+\)", "", " ".join(str(e).split()))  # source paths differ between machines
    return re.sub(r"0x[0-9a-f]+", "0x…", text)[:200]


def run_row(info, row: Row, max_samples: int | None = None, seconds: int = 300, dynamic: bool = False) -> dict:
    """The row's outcome over its first `max_samples` samples (all by default): {"outcome", "reason",
    "lowered" (the ATen overloads kiln's lowering generated code for), "samples"}."""
    lowered, fallbacks, failure = set(), [], None
    chosen = []
    try:
        with time_limit(seconds):
            chosen = samples(info, row)[:max_samples]
            for sample in chosen:
                eager, got, observer = run_sample(info, sample, row, dynamic)
                lowered |= observer.lowered
                failure = failure or mismatch(eager, got, functools.partial(reference, info, sample, row))
                fallbacks += observer.fallbacks()
                if failure and failure.startswith("wrong result"):
                    break
    except TimeLimitExceeded as e:
        failure = failure or f"timeout: {e}"
    except Exception as e:  # the sampler itself, or a crash outside the compiled call
        failure = failure or f"error: {_describe(e)}"
    if failure:
        outcome, reason = "xfail", failure
    elif fallbacks:
        outcome, reason = "fallback", _short(Exception(fallbacks[0]))
    else:
        outcome, reason = "pass", ""
    return {"outcome": outcome, "reason": reason, "lowered": sorted(lowered), "samples": len(chosen)}

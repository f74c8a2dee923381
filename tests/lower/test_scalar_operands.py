"""A scalar meeting a bf16/fp16 tensor, beside eager, bit for bit (kiln/lower/scalar_operands.py).

Eager computes `h op s` for a half-type `h` in float and rounds once; the scalar `s` (a Python number, a 0-d
float32/float64/int64 tensor) is read either rounded to the half type first (`h + 0.1` adds half(0.1)) or at
its original value (the CPU kernels of mul and div: `h * torch.tensor(0.1)` multiplies by float(0.1)). kiln's
kernels read each the other way round for some ops, an ulp off. Every op below runs with each kind of scalar,
first and second, on the C++ target and on the Triton target (over CPU tensors, under TRITON_INTERPRET=1).
"""
from __future__ import annotations

import re

import pytest
import torch

import kiln
from support.triton_device import DEVICE, INTERPRETING

TARGETS = [None, pytest.param({"cpu_backend": "triton"}, marks=pytest.mark.skipif(
    DEVICE != "cpu" or not INTERPRETING, reason="Triton kernels over CPU tensors need TRITON_INTERPRET=1"))]

OPS = {
    "add": lambda h, s: (h + s, s + h),
    "sub": lambda h, s: (h - s, s - h),
    "mul": lambda h, s: (h * s, s * h),
    "div": lambda h, s: (h / s, s / h),
    "true_divide": lambda h, s: (torch.true_divide(h, s),),
    "div_floor": lambda h, s: (torch.div(h, s, rounding_mode="floor"), torch.div(h, s, rounding_mode="trunc")),
    "pow": lambda h, s: (h.abs() ** s, s ** (h / 8)),
    "clamp": lambda h, s: (torch.clamp(h, min=s), torch.clamp(h, max=s)),
    "where": lambda h, s: (torch.where(h > 0, h, s), torch.where(h > 0, s, h)),
    "lerp": lambda h, s: (torch.lerp(h, h * 2, s),),
    "addcmul": lambda h, s: (torch.addcmul(h, h, s) if isinstance(s, torch.Tensor) else
                             torch.addcmul(h, h, h, value=s), torch.addcdiv(h, h, s + h.abs() + 1)),
    "add_alpha": lambda h, s: (torch.add(h, h, alpha=s) if not isinstance(s, torch.Tensor) else
                               torch.add(h, s, alpha=3.3),),
    "maximum": lambda h, s: ((torch.maximum(h, s), torch.minimum(h, s)) if isinstance(s, torch.Tensor)
                             and s.dtype.is_floating_point else (h.clamp_min(s),)),
    "compare": lambda h, s: (h > s, h == s, s < h, h != s, h >= s),
    "fmod": lambda h, s: (torch.fmod(h, s), torch.remainder(h, s)),
}

SCALARS = {  # 0.1 and 2049 are no half-type values (half(2049) is 2048); 1000.3 is a bf16's ulp 4 from one
    "float32 tensor": lambda: torch.tensor(0.1),
    "float64 tensor": lambda: torch.tensor(1000.3, dtype=torch.float64),
    "int64 tensor": lambda: torch.tensor(2049),
    "Python float": lambda: 0.1,
    "Python int": lambda: 2049,
}


def _halves(dtype: torch.dtype) -> torch.Tensor:
    """The half-type values next to each scalar (where rounding the scalar decides a compare), then random ones:
    512 in all, so that eager computes every element in its vectorized loop (its scalar loop, for a tail of
    fewer elements than a vector holds, rounds some intermediate results of its own)."""
    near = torch.tensor([0.1, 1000.3, 2049.0]).to(dtype)
    near = torch.cat([near, torch.nextafter(near, near + 1), torch.nextafter(near, near - 1)])
    random = torch.randn(512 - len(near), generator=torch.Generator().manual_seed(0)) * 3
    return torch.cat([near, random.to(dtype)])


def _assert_bitwise(got, expected, what: str) -> None:
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype, (what, k, g.dtype, e.dtype)
        same = (g == e) | (g.isnan() & e.isnan()) if e.is_floating_point() else g == e
        assert bool(same.all()), f"{what}, result {k}: {int((~same).sum())} elements differ, e.g. " \
                                 f"{g[~same][:3].tolist()} vs eager's {e[~same][:3].tolist()}"


@pytest.mark.sampled(every=2, classes=("op",))
@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
@pytest.mark.parametrize("op", list(OPS))
def test_a_scalar_meets_a_half_type_tensor_as_in_eager(op, options):
    fn = OPS[op]

    def program(h16, hb16, *tensor_scalars):
        out = []
        for h in (h16, hb16):
            out += [r for s in tensor_scalars for r in fn(h, s)]
            out += [r for s in (0.1, 2049, 1000.3) for r in fn(h, s)]
        return out

    compiled = kiln.compile(program, options=options)
    args = (_halves(torch.float16), _halves(torch.bfloat16), *(SCALARS[k]() for k in SCALARS if "tensor" in k))
    _assert_bitwise(compiled(*args), program(*args), op)


@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
def test_a_scalar_in_a_training_graph_as_in_eager(options):
    """The forward and the backward read the scalar as eager does (the backward of `h * s` multiplies by it)."""
    def program(h, s):
        return (h * s + 0.1) / s

    compiled = kiln.compile(program, options=options)
    results = []
    for f in (program, compiled):
        h = _halves(torch.bfloat16).requires_grad_()
        out = f(h, torch.tensor(0.3))
        out.backward(torch.ones_like(out))
        results.append((out.detach(), h.grad))
    _assert_bitwise(results[1], results[0], "training")


ALPHA_OPS = {"add": lambda a, b: torch.add(a, b, alpha=0.1), "sub": lambda a, b: torch.sub(a, b, alpha=3.3),
             "add_": lambda a, b: a.clone().add_(b, alpha=-0.7),
             "alpha from sizes": lambda a, b: torch.add(a, b, alpha=a.shape[0] / 3000)}


def _two_halves(dtype: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return tuple((torch.randn(n, generator=g) * 3).to(dtype) for _ in range(2))


@pytest.mark.sampled(every=2, classes=("op", "dtype"))
@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("op", list(ALPHA_OPS))
def test_add_with_alpha_rounds_as_eager_s_vectorized_loop(op, dtype, options):
    """`a + alpha * b`: eager's vectorized loop rounds alpha to the half type, computes in float and rounds once
    (kiln's rule); its scalar loop, for the last `n % 32` elements, rounds `alpha * b` too. kiln matches every
    element but those of the tail."""
    program = ALPHA_OPS[op]
    a, b = _two_halves(dtype, 4091)
    got, expected = kiln.compile(program, options=options)(a, b), program(a, b)
    body = len(a) // 32 * 32
    _assert_bitwise([got[:body]], [expected[:body]], f"{op} in {dtype}")


@pytest.mark.xfail(strict=True, reason="eager's scalar tail loop rounds alpha * b to the half type before adding; "
                                       "kiln computes every element as the vectorized loop does")
def test_add_with_alpha_in_eager_s_tail_loop():
    a, b = _two_halves(torch.bfloat16, 4091)
    program = ALPHA_OPS["sub"]
    body = len(a) // 32 * 32
    _assert_bitwise([kiln.compile(program)(a, b)[body:]], [program(a, b)[body:]], "the tail")


# CUDA's kernels read a scalar by where it is (kiln/lower/scalar_operands.py; measured on an H100, torch 2.11): a
# host scalar (`py`, a Python number; `host`, a 0-d CPU tensor) at its original value in add/sub/mul and as a
# division's second operand, rounded to the half type elsewhere; a 0-d tensor on the GPU (`device`) rounded always.
CUDA_READS = {  # the call: (py, host, device), ORIGINAL or ROUNDED
    "h + s": (lambda h, s: h + s, "OOR"), "s + h": (lambda h, s: torch.add(s, h), "OOR"),
    "h - s": (lambda h, s: h - s, "OOR"), "s - h": (lambda h, s: torch.sub(s, h), "OOR"),
    "h * s": (lambda h, s: h * s, "OOR"), "s * h": (lambda h, s: torch.mul(s, h), "OOR"),
    "h / s": (lambda h, s: h / s, "OOR"), "s / h": (lambda h, s: torch.div(s, h), "RRR"),
    "h // s": (lambda h, s: torch.div(h, s, rounding_mode="floor"), "OOR"),
    "s // h": (lambda h, s: torch.div(s, h, rounding_mode="floor"), "RRR"),
    "add alpha": (lambda h, s: torch.add(h, s, alpha=0.7), "OOR"),
    "add alpha, s first": (lambda h, s: torch.add(s, h, alpha=0.7), "OOR"),
    "pow": (lambda h, s: torch.pow(h, s), "RRR"), "pow, s first": (lambda h, s: torch.pow(s, h), "RRR"),
    "remainder": (lambda h, s: torch.remainder(h, s), "RRR"), "eq": (lambda h, s: h == s, "RRR"),
    "xlogy": (lambda h, s: torch.xlogy(h, s), "RRR"), "xlogy, s first": (lambda h, s: torch.xlogy(s, h), "RRR"),
    "lerp weight": (lambda h, s: torch.lerp(h, h * 2, s), "ORR"),
}
SCALAR = 0.3  # no half-type value: its reading shows in the lowered IR


def _lowered(fn, device: str, dtype: torch.dtype, kind: str) -> str:
    """The IR kiln lowers `fn(h, s)` to, for a `dtype` tensor `h` on `device` and the scalar `s` of `kind`, on
    fake tensors (tests/support/fake_cuda.py: nothing is launched). A 0-d tensor `s` is float64 and input 1."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln import pipeline
    from kiln.codegen.target import select_target
    from kiln.lower.decompositions import decomposition_table
    from support.fake_cuda import allow_fake_cuda

    allow_fake_cuda()
    mode = FakeTensorMode()
    with mode:
        h = torch.empty(8, dtype=dtype, device=device)
        s = torch.empty((), dtype=torch.float64, device="cpu" if kind == "host" else device)
    with mode:
        if kind == "py":
            inputs, gm = [h], make_fx(lambda h: fn(h, SCALAR), decomposition_table=decomposition_table())(h)
        else:
            inputs, gm = [h, s], make_fx(fn, decomposition_table=decomposition_table())(h, s)
    decomposed = pipeline.decompose(gm, inputs)
    return str(pipeline.lower(decomposed, inputs, select_target(decomposed, inputs), shape_padding=False))


def _reading(ir_text: str, dtype: torch.dtype, kind: str) -> str:
    """"R" where the IR reads the scalar rounded to `dtype`, "O" where it reads it in float32 at its value."""
    if kind == "py":
        rounded = (repr(torch.tensor(SCALAR, dtype=torch.float64).to(dtype).item()),)
        # as a Python float, held in float32, or its float32 reciprocal (a CUDA division multiplies by it)
        values = (SCALAR, torch.tensor(SCALAR).item(), (1 / torch.tensor(SCALAR)).item())
        original = any(re.search(rf"(?<![\d.]){re.escape(repr(v))}(?!\d)", ir_text) for v in values)
    else:  # cast in a kernel (the input, or its copy on the GPU), or by an ATen call on the CPU
        name = str(dtype).removeprefix("torch.")
        scalars = ["arg1", *re.findall(r"(buf\d+): \S+ = extern aten._to_copy.default\(arg1, device=", ir_text)]
        rounded = (*(f"cast(load({b}, 0), {name})" for b in scalars), f"_to_copy.default(arg1, dtype=torch.{name})")
        original = any(f"cast(load({b}, 0), float32)" in ir_text for b in scalars)
    readings = {"R"} if any(r in ir_text for r in rounded) else set()
    readings |= {"O"} if original else set()
    assert len(readings) == 1, f"no single reading of the scalar in\n{ir_text}"
    return readings.pop()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("call", list(CUDA_READS))
def test_a_cuda_graph_reads_a_scalar_as_cuda_s_kernels_read_it(call, dtype):
    fn, expected = CUDA_READS[call]
    got = "".join(_reading(_lowered(fn, "cuda", dtype, kind), dtype, kind) for kind in ("py", "host", "device"))
    assert got == expected, f"{call}: (py, host, device) read {got}, CUDA's kernels {expected}"


@pytest.mark.parametrize("call, expected", [("h + s", "RR"), ("h * s", "OO"), ("s * h", "OR")])
def test_a_cpu_graph_reads_a_scalar_as_the_cpu_s_kernels_read_it(call, expected):
    """The same calls on the CPU (where every 0-d tensor is a host scalar) keep the CPU's own reading."""
    fn = CUDA_READS[call][0]
    got = "".join(_reading(_lowered(fn, "cpu", torch.bfloat16, kind), torch.bfloat16, kind) for kind in ("py", "host"))
    assert got == expected, f"{call}: (py, host) read {got} on the CPU, eager {expected}"


def test_a_cuda_division_by_a_number_multiplies_by_its_float_reciprocal():
    """CUDA's true division by a host scalar computes `float(h) * (1.0f / b)`, rounded once; the floor
    division divides."""
    ir_text = _lowered(lambda h, s: (h / SCALAR, h / 3), "cuda", torch.bfloat16, "py")
    for b in (SCALAR, 3):
        reciprocal = (torch.tensor(1.0) / torch.tensor(float(b))).item()
        assert f"mul(cast(load(arg0, i0), float32), {reciprocal!r})" in ir_text, ir_text


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_cuda_division_of_float_values_by_a_host_scalar_multiplies_by_its_reciprocal(dtype):
    """Not only half types: a float32 (float64) value divided by a host scalar is, on the GPU, its product with
    the reciprocal taken in float32 (double), an ulp from the quotient at times (GPU fuzz seed 510114's class);
    a 0-d CPU tensor's reciprocal is taken in the kernel, from the tensor's value in the math type."""
    number = _lowered(lambda h, s: h / SCALAR, "cuda", dtype, "py")
    reciprocal = (torch.tensor(1.0, dtype=dtype) / torch.tensor(SCALAR, dtype=dtype)).item()
    assert f"mul(load(arg0, i0), {reciprocal!r})" in number and "truediv" not in number, number
    host = _lowered(lambda h, s: h / s, "cuda", dtype, "host")
    assert "reciprocal(" in host and "truediv" not in host, host
    if dtype == torch.float32:  # the float64 scalar held in float32 first
        assert "cast(load(arg1, 0), float32)" in host or "_to_copy" in host, host


def _lowered_with_a_symbolic_size(fn, device: str) -> str:
    """The IR of `fn(h)` for a float32 `h` of symbolic length on `device` (fake tensors: nothing launched)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from kiln import pipeline
    from kiln.codegen.target import select_target
    from kiln.lower.decompositions import decomposition_table
    from support.fake_cuda import allow_fake_cuda

    allow_fake_cuda()
    mode = FakeTensorMode(shape_env=ShapeEnv())
    n = mode.shape_env.create_symintnode(mode.shape_env.create_symbol(7, ConstantSource("n")), hint=7)
    with mode:
        h = torch.empty(n, device=device)
        gm = make_fx(fn, decomposition_table=decomposition_table())(h)
    inputs = [h]
    decomposed = pipeline.decompose(gm, inputs)
    return str(pipeline.lower(decomposed, inputs, select_target(decomposed, inputs), shape_padding=False))


@pytest.mark.parametrize("device, reading", [("cuda", "float32"), ("cpu", "float16")])
def test_a_float_computed_from_sizes_is_a_host_scalar_on_cuda(device, reading):
    """`h.half() + h.shape[0] / 3` under dynamic shapes: CUDA's add reads the Python float at its value in float,
    the CPU's rounds it to the half type (fuzz seeds 411254, 411344: read as a GPU tensor, rounded, on CUDA)."""
    ir_text = _lowered_with_a_symbolic_size(lambda h: h.half() + h.shape[0] / 3, device)
    size_float = re.search(r"truediv\(cast\(index\(\w+\), float64\), 3\.0\)", ir_text)
    assert size_float is not None, ir_text
    read_as = re.search(rf"cast\({re.escape(size_float.group(0))}, (\w+)\)", ir_text)
    assert read_as is not None and read_as.group(1) == reading, ir_text


def test_alpha_is_read_at_its_value_on_cuda_and_rounded_on_the_cpu():
    """`add(a, b, alpha=0.7)` of two half tensors: CUDA's kernel reads alpha in float, the CPU's vector loop
    rounds it to the half type first."""
    def add(h, s):
        return torch.add(h, h * 2, alpha=SCALAR)
    assert _reading(_lowered(add, "cuda", torch.float16, "py"), torch.float16, "py") == "O"
    assert _reading(_lowered(add, "cpu", torch.float16, "py"), torch.float16, "py") == "R"


GPU_SCALARS = {"Python float": lambda: SCALAR, "float32 CPU tensor": lambda: torch.tensor(SCALAR),
               "float64 CPU tensor": lambda: torch.tensor(SCALAR, dtype=torch.float64),
               "float32 GPU tensor": lambda: torch.tensor(SCALAR, device="cuda")}


# Calls compared by how many results differ: eager's CUDA kernels divide by a host scalar as a product with its
# float reciprocal, which kiln computes for a Python number, while a 0-d CPU tensor's value is not known while
# lowering and kiln's kernel divides in float; Triton's float32 `/` is within 2 ulps where CUDA's is exact, and
# its `log` is not CUDA's `logf`. Each leaves an ulp of the half type apart where a result lies next to a rounding
# boundary (docs/numerics.md).
ROUNDED_APART = ("h / s", "s / h", "h // s", "s // h", "xlogy", "xlogy, s first")


def _bitwise(name: str, kind: str) -> bool:
    """Is call `name` with a scalar of `kind` compared bit for bit: all but `ROUNDED_APART`, and the product a
    division by a Python number is."""
    return name not in ROUNDED_APART or (name, kind) == ("h / s", "Python float")


def _halves_on_cuda(dtype: torch.dtype) -> torch.Tensor:
    h = (torch.randn(4099, generator=torch.Generator().manual_seed(0)) * 3).to(dtype).cuda()
    return torch.where(h == 0, torch.ones_like(h), h)


def _run_beside_eager(calls: list, kind: str, h: torch.Tensor) -> tuple[list, list]:
    """(kiln's results, eager's) of `calls`, each `fn(h, s)` for the scalar `s` of `kind`."""
    def program(h, s):
        return [fn(h, s) for fn in calls]

    if kind == "Python float":
        return kiln.compile(lambda h: program(h, SCALAR))(h), program(h, SCALAR)
    s = GPU_SCALARS[kind]()
    return kiln.compile(program)(h, s), program(h, s)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", list(GPU_SCALARS))
def test_a_scalar_meets_a_half_type_tensor_on_cuda_as_in_eager(kind, dtype):
    """Every call of `CUDA_READS` on the GPU, bit for bit with eager, for each kind of scalar (but the divisions,
    below); 4099 elements, so that no reading passes by luck."""
    names = [n for n in CUDA_READS if _bitwise(n, kind)]
    got, expected = _run_beside_eager([CUDA_READS[n][0] for n in names], kind, _halves_on_cuda(dtype))
    _assert_bitwise(got, expected, f"{kind} with {dtype}: the calls {names} in order")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", list(GPU_SCALARS))
def test_a_division_or_xlogy_on_cuda_reads_its_scalar_as_eager(kind, dtype):
    """Values as eager's within the rounding of `ROUNDED_APART`: at most 2 of 4099 results an ulp or a unit of the
    floor apart (the other reading of the scalar moves 1 in 4 true quotients; which reading the lowering emits,
    the fake-CUDA tests above check)."""
    h = _halves_on_cuda(dtype)
    names = [n for n in ROUNDED_APART if not _bitwise(n, kind)]
    got, expected = _run_beside_eager([CUDA_READS[n][0] for n in names], kind, h)
    for name, g, e in zip(names, got, expected):
        differ = (g != e) & ~(g.isnan() & e.isnan())  # xlogy of a negative h is NaN in both
        assert int(differ.sum()) <= 2, f"{name}: {int(differ.sum())} of {len(h)} differ, e.g. " \
                                       f"{g[differ][:3].tolist()} vs eager's {e[differ][:3].tolist()}"


@pytest.mark.parametrize("device, fused", [("cuda", True), ("cpu", False)])
def test_add_with_alpha_is_one_fused_multiply_add_on_cuda(device, fused):
    """CUDA's add kernel computes `a + alpha * b` as one fused multiply-add (its compiler contracts it), which
    kiln's Triton kernels, compiled without contraction, write out (`fma`); the CPU's rounds the product."""
    ir_text = _lowered(lambda h, s: (torch.add(h, s, alpha=0.7), torch.sub(h, s, alpha=0.7)), device,
                       torch.float32, "device" if device == "cuda" else "host")
    assert (ir_text.count("fma(") == 2) == fused, ir_text

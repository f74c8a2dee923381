"""Matmul templates and shape padding: what the Triton target does with aten mm/addmm/bmm.

`prepare(graph, device, max_autotune=, shape_padding=)` runs on the lowered graph before scheduling:

- with `max_autotune`, each extern `mm`, `addmm` (beta = alpha = 1) or `bmm` over float32 /
  bfloat16 / float16 tensors of static sizes becomes a *template node*; without it, only the
  small ones do (`small_matmul`: host-bound, where a cuBLAS call costs the host more than a
  Triton launch and the GPU work is a few microseconds), with one tile configuration chosen
  by `default_config` instead of a benchmark. A template node is a ComputedBuffer
  whose data is the matmul as a sum reduction (ranges [B,] M, N; reduction K; the body
  multiplies the two operand loads, so the scheduler, the memory planner and the
  dependency analysis read it like any reduction), named in the returned dict with its
  `MatmulSpec`. addmm's bias becomes a pointwise node after it (`bias + mm`) under the
  extern's name, the first epilogue. The scheduler gives a template node a kernel of its
  own and fuses the pointwise nodes after it as epilogue segments (option
  `epilogue_fusion`).
- on CUDA, an extern float32 (or float64) `addmm` (beta = alpha = 1) of a small result (host-bound:
  `UNFUSED_BIAS_MAX_ELEMENTS`) whose result only kernels read (pointwise or reductions: a layer norm) becomes `mm`
  and a pointwise `bias + mm` under its name, which the scheduler fuses into those readers (`_unfused_bias`):
  eager's addmm asks cuBLASLt for its bias epilogue, whose algorithm query costs the host more per call than the mm
  and the fused add (a ViT-B/16 at batch 1 is host-bound on its 48 linear layers). The product is a float32 result
  either way; a bf16/fp16 addmm stays, as its mm would be rounded before the add.
- with `shape_padding` (and no template), an extern matmul on CUDA whose K or N is not a
  multiple of 8 (fp16/bf16) or 4 (fp32 when TF32 is allowed), and that is compute-bound
  (`worth_padding`), calls `PaddedMatmul`: the operands are zero-padded on those dims,
  the result sliced back.

`MatmulTemplateKernel` emits the template group: a tiled `tl.dot` kernel over
[BLOCK_M, BLOCK_N] tiles of the output (grouped launch order for L2 reuse), the fp32
accumulator rounded to the matmul's dtype as eager rounds, stored only if another step
reads it, then the epilogue segments computed on the tile in registers. The group's
entry is, under max-autotune, an `Autotuned` over several tile configurations and `aten`: the
ATen matmul (padded when `shape_padding` says so) followed by the epilogue as a pointwise Triton
kernel of its own — the fastest is kept, per kiln/runtime/autotune.py; in the other modes it is
the template with `default_config`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import sympy
import torch

from kiln.codegen.cse import Scope
from kiln.codegen.triton import ops
from kiln.codegen.triton.heuristics import LaunchConfig, _index_dtype, next_pow2
from kiln.codegen.triton.kernel import TritonKernel
from kiln.codegen.triton.libdevice import interpreting
from kiln.lower import ir
from kiln.lower.index import index_vars
from kiln.lower.shape_padding import needs_padding, padding_multiple, worth_padding
from kiln.runtime import graph_cache
from kiln.schedule import deps
from kiln.schedule.fusion import KernelGroup, Segment, nonunit

aten = torch.ops.aten
MATMULS = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm"}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class MatmulConfig:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    num_warps: int
    num_stages: int
    GROUP_M: int = 8

    def label(self) -> str:
        return (f"template BLOCK_M={self.BLOCK_M} BLOCK_N={self.BLOCK_N} BLOCK_K={self.BLOCK_K} "
                f"num_warps={self.num_warps} num_stages={self.num_stages}")


# Tile shapes tried on the GPU, the first the default (the usual good ones for tensor cores).
MATMUL_CONFIGS = [
    MatmulConfig(64, 64, 32, 4, 3), MatmulConfig(128, 128, 32, 8, 3), MatmulConfig(128, 64, 32, 4, 4),
    MatmulConfig(64, 128, 32, 4, 4), MatmulConfig(128, 128, 64, 8, 3), MatmulConfig(64, 64, 64, 4, 4),
    MatmulConfig(128, 256, 32, 8, 3), MatmulConfig(32, 64, 32, 4, 5), MatmulConfig(64, 32, 32, 4, 5),
    MatmulConfig(32, 32, 32, 2, 5), MatmulConfig(16, 32, 32, 2, 5), MatmulConfig(16, 64, 64, 4, 3),
]


def matmul_configs(M: int, N: int, K: int, limit: int) -> list[MatmulConfig]:
    """The tile configurations worth trying for an M x N x K matmul: blocks no larger than the (power of
    two above the) sizes, at least 16 (tl.dot's minimum), de-duplicated, at most `limit`."""
    out: list[MatmulConfig] = []
    for c in MATMUL_CONFIGS:
        c = MatmulConfig(max(16, min(c.BLOCK_M, next_pow2(M))), max(16, min(c.BLOCK_N, next_pow2(N))),
                         max(16, min(c.BLOCK_K, next_pow2(K))), c.num_warps, c.num_stages, c.GROUP_M)
        if c not in out:
            out.append(c)
        if len(out) == limit:
            break
    return out


# A matmul is "small" (host-bound) under both bounds: its multiply-adds, and K, which a template program
# walks serially (no split-K). On the host, torch.mm or addmm costs more per call than a template launch,
# and the epilogue a template takes saves a launch and an allocation more (benchmarks/wrapper_lines.py
# --isolated and benchmarks/step_parts.py measure both). A narrow matmul over a long K (a small CNN's
# classifier) is not small: the few programs walking K serially would cost more GPU time than they save.
SMALL_MATMUL_MACS = 1 << 25
SMALL_MATMUL_MAX_K = 1024


def small_matmul(batch: int, M: int, N: int, K: int) -> bool:
    """Is this matmul cheap enough on the GPU that its host cost decides, so a template beats cuBLAS?"""
    return batch * M * N * K <= SMALL_MATMUL_MACS and K <= SMALL_MATMUL_MAX_K


def default_config(M: int, N: int, K: int) -> MatmulConfig:
    """The tiles of a small matmul's template without autotuning: blocks no larger than the sizes (at least
    16, tl.dot's minimum), narrower columns for a vector-like M so that more programs share the work."""
    block_m = max(16, min(64, next_pow2(M)))
    block_n = max(16, min(64 if M > 16 else 32, next_pow2(N)))
    block_k = max(16, min(64, next_pow2(K)))
    return MatmulConfig(block_m, block_n, block_k, num_warps=4, num_stages=3 if K > 2 * block_k else 2)


@dataclass
class MatmulSpec:
    """What a template node computes: [batch x] M x N = A @ B with A, B given as buffer views."""

    op: str           # "mm" | "bmm"
    a: ir.TensorRef   # [B,] M, K
    b: ir.TensorRef   # [B,] K, N
    batch: int        # 1 for mm
    M: int
    N: int
    K: int
    dtype: torch.dtype
    pad: int = 0      # shape padding multiple for the ATen path (0: none)


# ----------------------------------------------------------------------------- shape padding


def _pad_dim(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """`t` zero-padded along `dim` to a multiple of `multiple`, stored in `t`'s own memory order: a weight read
    transposed (a tied LM head's `embedding.T`) is padded by a copy that reads and writes it in the same order,
    not transposed into rows by a strided copy (a matmul takes either order at no cost)."""
    size = t.shape[dim]
    extra = -size % multiple
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] += extra
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))  # outermost first; stable for equal strides
    stride, step = [0] * t.dim(), 1
    for d in reversed(order):
        stride[d], step = step, step * shape[d]
    out = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)
    out.narrow(dim, size, extra).zero_()
    out.narrow(dim, 0, size).copy_(t)
    return out


def padded_matmul(op: str, args: tuple, kwargs: dict, multiple: int) -> torch.Tensor:
    """`mm`/`addmm`/`bmm` with K and N zero-padded to `multiple` and the result sliced back to N columns."""
    if op == "addmm":
        bias, a, b = args
    else:
        a, b = args
    n = b.shape[-1]
    a_p = _pad_dim(a, -1, multiple)
    b_p = _pad_dim(_pad_dim(b, -2, a_p.shape[-1]), -1, multiple)  # K as long as A's (A may come wider)
    if op == "mm":
        out = torch.mm(a_p, b_p)
    elif op == "bmm":
        out = torch.bmm(a_p, b_p)
    else:
        if bias.dim() >= 1 and bias.shape[-1] == n and n > 1:
            bias = _pad_dim(bias, -1, multiple)
        out = torch.addmm(bias, a_p, b_p, **kwargs)
    return out[..., :n] if out.shape[-1] != n else out


@graph_cache.describable  # a graph calling it is kept in the compile cache like one calling ATen ops only
class PaddedMatmul:
    """An extern's op: the ATen matmul with shape padding (the wrapper calls it as it calls ATen ops)."""

    def __init__(self, op: str, multiple: int):
        self.op, self.multiple = op, multiple

    def __call__(self, *args, **kwargs):
        return padded_matmul(self.op, args, kwargs, self.multiple)

    def __repr__(self) -> str:
        return f"PaddedMatmul({self.op}, multiple={self.multiple})"

    def fields(self) -> dict:
        return {"op": self.op, "multiple": self.multiple}


def aten_matmul_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, multiple: int) -> None:
    """`out = a @ b` through ATen (the template's competitor), padded when `multiple` asks for it."""
    if needs_padding(a.shape[-1], b.shape[-1], multiple):
        out.copy_(padded_matmul("bmm" if a.dim() == 3 else "mm", (a, b), {}, multiple))
    elif a.dim() == 3:
        torch.bmm(a, b, out=out)
    else:
        torch.mm(a, b, out=out)


# ----------------------------------------------------------------------------- the graph pass


def _static(expr):
    expr = sympy.sympify(expr)
    return int(expr) if expr.is_Integer else None


def _operand_index(ref: ir.TensorRef, dims) -> sympy.Expr:
    """The load index of `ref` at index expressions `dims` (one per dim of the view)."""
    lay = ref.layout
    return sympy.expand(sympy.sympify(lay.offset) + sum((d * s for d, s in zip(dims, lay.stride)), sympy.Integer(0)))


def _broadcast_index(ref: ir.TensorRef, out_vars) -> sympy.Expr:
    """Index of `ref` broadcast (right-aligned, size-1 dims repeated) to an output indexed by `out_vars`."""
    lay = ref.layout
    idx = sympy.sympify(lay.offset)
    for d, (size, stride) in enumerate(zip(reversed(lay.size), reversed(lay.stride))):
        if size != 1:
            idx += out_vars[len(out_vars) - 1 - d] * stride
    return sympy.expand(idx)


def _template_node(n: ir.Extern, pad: int, autotune: bool):
    """(nodes replacing the extern, name -> MatmulSpec) or None when the template cannot compute it, or
    (without `autotune`) the matmul is not small enough to prefer it unmeasured."""
    kind = MATMULS[n.op]
    if kind == "addmm":
        if len(n.args) != 3 or any(float(v) != 1 for v in n.kwargs.values()):
            return None
        bias, a, b = n.args
    else:
        if len(n.args) != 2 or n.kwargs:
            return None
        a, b = n.args
        bias = None
    refs = [r for r in (a, b, bias) if r is not None]
    if not all(isinstance(r, ir.TensorRef) for r in refs) or not isinstance(n.layout, ir.Layout):
        return None
    dtype = n.layout.dtype
    if dtype not in DTYPES or any(r.layout.dtype != dtype for r in refs):
        return None
    sizes = [_static(s) for r in (a, b) for s in r.layout.size] + [_static(s) for s in n.layout.size]
    strides = [_static(s) for r in refs for s in list(r.layout.stride) + [r.layout.offset]]
    if any(s is None for s in sizes + strides):
        return None  # symbolic sizes: the extern stays
    if kind == "bmm":
        batch, M, K = (int(s) for s in a.layout.size)
        N = int(b.layout.size[2])
    else:
        batch, (M, K), N = 1, (int(s) for s in a.layout.size), int(b.layout.size[1])
    if K < 2 or M * N * batch == 0 or not (autotune or small_matmul(batch, M, N, K)):
        return None
    name = n.name if bias is None else f"{n.name}_mm"
    ranges = (batch, M, N) if kind == "bmm" else (M, N)
    i = index_vars("i", len(ranges))
    r0 = index_vars("r", 1)[0]
    if kind == "bmm":
        ia, ib = _operand_index(a, (i[0], i[1], r0)), _operand_index(b, (i[0], r0, i[2]))
    else:
        ia, ib = _operand_index(a, (i[0], r0)), _operand_index(b, (r0, i[1]))
    body = ir.Op("mul", (ir.Load(a.buf, ia, dtype), ir.Load(b.buf, ib, dtype)), dtype)
    mm_layout = n.layout if bias is None else ir.Layout.contiguous(n.layout.size, dtype)
    node = ir.ComputedBuffer(name, mm_layout, ir.Reduction(tuple(sympy.Integer(s) for s in ranges),
                                                           (sympy.Integer(K),), "sum", body))
    spec = MatmulSpec("bmm" if kind == "bmm" else "mm", a, b, batch, M, N, K, dtype, pad)
    nodes = [node]
    if bias is not None:
        out_index = sympy.expand(sum((v * s for v, s in zip(i, mm_layout.stride)), sympy.Integer(0)))
        add = ir.Op("add", (ir.Load(bias.buf, _broadcast_index(bias, i), dtype), ir.Load(name, out_index, dtype)),
                    dtype)
        nodes.append(ir.ComputedBuffer(n.name, n.layout, ir.Pointwise(tuple(sympy.Integer(s) for s in ranges), add)))
    return nodes, {name: spec}


def _whole_rows(a: ir.TensorRef, graph: ir.LoweredGraph) -> ir.TensorRef:
    """The K operand `a` widened to its buffer's whole rows when the lowering stored it with zero-padded
    rows (`LoweredGraph.zero_padded`): the padded matmul reads them instead of copying `a` into a padded
    tensor."""
    width = graph.zero_padded.get(a.buf)
    lay = a.layout
    if width is None or _static(lay.size[-1]) != width or _static(lay.stride[-1]) != 1 or _static(lay.offset) != 0:
        return a
    row = _static(lay.stride[-2])
    wide = ir.Layout(tuple(lay.size[:-1]) + (sympy.Integer(row),), lay.stride, lay.dtype, lay.offset)
    return ir.TensorRef(a.buf, wide, view=True)


def prepare(graph: ir.LoweredGraph, device: str, *, max_autotune: bool, shape_padding: bool) -> dict:
    """Rewrite `graph`'s extern matmuls for max-autotune templates and shape padding (see the module
    docstring); returns the template nodes' specs (node name -> MatmulSpec) for the scheduler."""
    device_type = torch.device(device).type
    templates: dict = {}
    nodes = []
    readers = functools.cache(lambda: deps.readers(graph))  # a pass over the graph, for a graph with an addmm
    for n in graph.nodes:
        # a matmul whose template kernel failed to build stays the ATen call (kiln.fallbacks)
        if isinstance(n, ir.Extern) and n.op in MATMULS and isinstance(n.layout, ir.Layout) \
                and not graph.origins.get(n.name, frozenset()) & graph.through_aten:
            dtype = n.layout.dtype
            multiple = padding_multiple(dtype, device_type) if shape_padding else 0
            made = _template_node(n, multiple, max_autotune)
            if made is not None:
                nodes += made[0]
                templates.update(made[1])
                continue
            unfused = _unfused_bias(n, readers, graph) if device_type == "cuda" else None
            if unfused is not None:
                n = unfused[0]
            if multiple:
                refs = [a for a in n.args if isinstance(a, ir.TensorRef)]
                m, k = (_static(d) for d in refs[-2].layout.size[-2:])
                nn = _static(refs[-1].layout.size[-1])
                if None not in (m, k, nn) and needs_padding(k, nn, multiple) and worth_padding(m, nn, k):
                    args = tuple(_whole_rows(a, graph) if a is refs[-2] else a for a in n.args)
                    n = ir.Extern(n.name, PaddedMatmul(MATMULS[n.op], multiple), args, n.kwargs, n.layout,
                                  n.aliases_inputs)
            if unfused is not None:
                nodes += [n, unfused[1]]
                continue
        nodes.append(n)
    graph.nodes = nodes
    return templates


# The largest addmm result (elements) whose bias is unfused: where the add fails to fuse into its readers (a
# reader over a permuted view: a Swin window, a ConvNeXt block's return to NCHW), it runs as a kernel of its own,
# whose pass over the result must stay within the few microseconds of host time the unfusing saves. Beyond it,
# steps are bound by the GPU, which adds the bias in cuBLASLt's epilogue for free (Swin-T and ConvNeXt-T fp32
# inference at batch 64 ran 7-20% slower unfused on the H100).
UNFUSED_BIAS_MAX_ELEMENTS = 1 << 21


def _unfused_bias(n: ir.Extern, readers_of: Callable,
                  graph: ir.LoweredGraph) -> tuple[ir.Extern, ir.ComputedBuffer] | None:
    """(the `mm` extern, the pointwise `bias + mm` named as `n`) for an `addmm` read only by kernels' nodes (module
    docstring), or None. `readers_of()`: the graph's readers of each buffer (`deps.readers`)."""
    if n.op is not aten.addmm.default or len(n.args) != 3 or any(float(v) != 1 for v in n.kwargs.values()):
        return None
    elements = _static(n.layout.size[0] * n.layout.size[1])
    if elements is None or elements > UNFUSED_BIAS_MAX_ELEMENTS:
        return None
    if n.layout.dtype not in (torch.float32, torch.float64):  # a half-type mm rounds before the add: a second
        return None  # rounding, which compounds over a deep model's layers
    bias, a, b = n.args
    if not all(isinstance(r, ir.TensorRef) for r in (bias, a, b)) or bias.layout.dtype != n.layout.dtype:
        return None
    readers = readers_of().get(n.name, ())  # last: a pass over the whole graph, made once
    if not readers or not all(isinstance(r, ir.ComputedBuffer) for r in readers):
        return None
    name = f"{n.name}_mm"
    mm = ir.Extern(name, aten.mm.default, (a, b), {}, ir.Layout.contiguous(n.layout.size, n.layout.dtype))
    if n.name in graph.origins:
        graph.origins[name] = graph.origins[n.name]
    i = index_vars("i", 2)
    out_index = sympy.expand(sum((v * s for v, s in zip(i, mm.layout.stride)), sympy.Integer(0)))
    dtype = n.layout.dtype
    add = ir.Op("add", (ir.Load(bias.buf, _broadcast_index(bias, i), dtype), ir.Load(name, out_index, dtype)), dtype)
    return mm, ir.ComputedBuffer(n.name, n.layout, ir.Pointwise(tuple(n.layout.size), add))


# ----------------------------------------------------------------------------- the kernel


class MatmulTemplateKernel(TritonKernel):
    """The tiled matmul of a template group, with its epilogue segments fused (one config's launcher)."""

    def __init__(self, group: KernelGroup, layouts: dict, spec: MatmulSpec, mcfg: MatmulConfig, external=None):
        config = LaunchConfig("template", 1, index_dtype=_index_dtype(group, layouts))
        super().__init__(group, layouts, config, external)
        self.spec, self.mcfg = spec, mcfg
        self.jit_name = f"triton_{group.name}_mm"
        dims = (spec.batch, spec.M, spec.N) if spec.op == "bmm" else (spec.M, spec.N)
        if tuple(group.outer) != nonunit(tuple(sympy.Integer(d) for d in dims)):
            raise NotImplementedError(f"template group {group.name}: outer {group.outer} is not the matmul's {dims}")

    def generate(self) -> str:
        g, spec = self.group, self.spec
        mm = g.nodes[0]
        a, b = spec.a, spec.b
        wide = self.config.index_dtype == "tl.int64"
        cast = ".to(tl.int64)" if wide else ""
        self.inputs[a.buf] = None
        self.inputs[b.buf] = None
        bmm = spec.op == "bmm"
        self.line("pid = tl.program_id(0)")
        self.line(f"bid = tl.program_id(1){cast}" if bmm else "bid = 0")
        self.line(f"grid_m = ({spec.M} + BLOCK_M - 1) // BLOCK_M")
        self.line(f"grid_n = ({spec.N} + BLOCK_N - 1) // BLOCK_N")
        self.line("width = GROUP_M * grid_n  # programs of one group of GROUP_M tile rows (L2 reuse)")
        self.line("first_m = (pid // width) * GROUP_M")
        self.line("group_rows = tl.minimum(grid_m - first_m, GROUP_M)")
        self.line("pid_m = first_m + (pid % group_rows)")
        self.line("pid_n = (pid % width) // group_rows")
        self.line(f"rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){cast}")
        self.line(f"rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){cast}")
        self.line(f"rk = tl.arange(0, BLOCK_K){cast}")
        self.line(f"ram = rm % {spec.M}  # rows past M read row (r mod M): no mask needed, never stored")
        self.line(f"rbn = rn % {spec.N}")
        sa = [int(s) for s in a.layout.stride]
        sb = [int(s) for s in b.layout.stride]
        ba, bb = (f"bid * {sa[0]} + ", f"bid * {sb[0]} + ") if bmm else ("", "")
        sam, sak = sa[-2:]
        sbk, sbn = sb[-2:]
        self.line(f"a_ptrs = {a.buf} + ({int(a.layout.offset)} + {ba}ram[:, None] * {sam} + rk[None, :] * {sak})")
        self.line(f"b_ptrs = {b.buf} + ({int(b.layout.offset)} + {bb}rk[:, None] * {sbk} + rbn[None, :] * {sbn})")
        self.line("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        # fp32 as eager computes it: TF32 only where torch allows it (half inputs: the tensor cores' own precision)
        precision = ""
        if spec.dtype == torch.float32:
            mode = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
            precision = f', input_precision="{mode}"'
        self.line(f"for k in range(0, {spec.K}, BLOCK_K):")
        self.indent += 1
        self.line("if EVEN_K:")
        self.line("    a = tl.load(a_ptrs)")
        self.line("    b = tl.load(b_ptrs)")
        self.line("else:")
        self.line(f"    a = tl.load(a_ptrs, mask=rk[None, :] < {spec.K} - k, other=0.0)")
        self.line(f"    b = tl.load(b_ptrs, mask=rk[:, None] < {spec.K} - k, other=0.0)")
        if spec.dtype == torch.bfloat16 and interpreting():  # the interpreter's bf16 dot is wrong; fp32 is exact
            self.line("a, b = a.to(tl.float32), b.to(tl.float32)")
        self.line(f"acc += tl.dot(a, b{precision})")
        self.line(f"a_ptrs += BLOCK_K * {sak}")
        self.line(f"b_ptrs += BLOCK_K * {sbk}")
        self.indent -= 1
        # the epilogue runs on the tile: every loop variable is a [BLOCK_M, BLOCK_N] block
        zero = f"tl.zeros([BLOCK_M, BLOCK_N], {'tl.int64' if wide else 'tl.int32'})"
        self.line(f"xm = rm[:, None] + {zero}")
        self.line(f"xn = rn[None, :] + {zero}")
        self.line(f"xmask = (xm < {spec.M}) & (xn < {spec.N})")
        self.line(f"xindex = xm * {spec.N} + xn")
        dims = [("bid + " + zero, spec.batch)] if bmm else []
        dims += [("xm", spec.M), ("xn", spec.N)]
        for var, (code, _) in zip(g.outer_vars(), [d for d in dims if d[1] != 1]):
            self.line(f"{var} = {code}")
        value = "acc"
        if spec.dtype in ops.ROUNDED:  # eager's matmul result is rounded before anything reads it
            value = "mm_value"
            self.line(f"{value} = {ops.to_half('acc', spec.dtype)}.to(tl.float32)")
        self.line(f"# segment 0 (template): {mm.name} = {a.buf} @ {b.buf}")
        self._store(mm, value, spec.dtype)
        scope = Scope()
        for k, seg in enumerate(g.segments[1:], 1):
            self.line(f"# segment {k} (epilogue): {', '.join(n.name for n in seg.nodes)}")
            self._outer_segment(seg, scope)
        body = self.lines
        self._arguments()
        params = self.arg_names + [str(s) for s in self.size_args] + [
            f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K")]
        doc = (f"matmul template {spec.op} [{spec.batch} x] {spec.M} x {spec.N} x {spec.K} "
               f"({str(spec.dtype).replace('torch.', '')}), epilogue: "
               + (", ".join(n.name for n in g.nodes[1:]) or "none"))
        self.jit_source = "\n".join(["@triton.jit", f"def {self.jit_name}({', '.join(params)}):",
                                     f'    """{doc}"""'] + body)
        return self.jit_source + "\n\n\n" + self._launcher()

    def _launcher(self) -> str:
        spec, c = self.spec, self.mcfg
        sizes = [str(s) for s in self.size_args]
        tiles = f"{-(-spec.M // c.BLOCK_M) * -(-spec.N // c.BLOCK_N)}"
        grid = f"({tiles}, {spec.batch})"
        even = spec.K % c.BLOCK_K == 0
        launcher = (f"_launch_{self.jit_name}{self.launch_suffix} = Launcher({self.jit_name}, {len(self.arg_names)}, "
                    f"num_warps={c.num_warps}, num_stages={c.num_stages}, BLOCK_M={c.BLOCK_M}, BLOCK_N={c.BLOCK_N}, "
                    f"BLOCK_K={c.BLOCK_K}, GROUP_M={c.GROUP_M}, EVEN_K={even})")
        lines = [f"def {self.entry}({', '.join((self.signature or self.arg_names) + sizes)}):",
                 f"    _launch_{self.jit_name}{self.launch_suffix}({grid}, {', '.join(self.arg_names + sizes)})"]
        return launcher + "\n\n\n" + "\n".join(lines) + "\n"

    def example_args(self) -> tuple[list, list]:
        dtypes = [self.layouts[x].dtype for x in self.arg_names]
        ints = [int(v) if sympy.sympify(v).is_Integer else 2 for v in self.size_args]
        return dtypes, ints


def epilogue_group(group: KernelGroup) -> KernelGroup | None:
    """The template group's epilogue as a pointwise group of its own (reading the matmul from memory)."""
    segs = [Segment(False, list(s.nodes)) for s in group.segments[1:]]
    if not segs:
        return None
    mm = group.nodes[0].name
    return KernelGroup(f"{group.name}_epilogue", group.outer, (), segs, set(group.local) - {mm})


def aten_candidate(group: KernelGroup, spec: MatmulSpec, entry: str, signature: list, sizes: list,
                   epilogue: TritonKernel | None, layouts: dict) -> str:
    """Source of the `aten` candidate: ATen's matmul into the matmul buffer, then the epilogue kernel."""
    mm = group.nodes[0]
    lines = [f"def {entry}({', '.join(signature + sizes)}):"]
    for ref, var in ((spec.a, "_a"), (spec.b, "_b")):
        lay = ref.layout
        lines.append(f"    {var} = {ref.buf}.as_strided({tuple(int(s) for s in lay.size)}, "
                     f"{tuple(int(s) for s in lay.stride)}, {ref.buf}.storage_offset() + {int(lay.offset)})")
    if mm.name not in signature:  # kept in registers by the template: a buffer of its own here
        lay = layouts[mm.name]
        lines.append(f"    {mm.name} = torch.empty_strided({tuple(int(s) for s in lay.size)}, "
                     f"{tuple(int(s) for s in lay.stride)}, dtype={lay.dtype}, device=_a.device)")
    lines.append(f"    aten_matmul_out(_a, _b, {mm.name}, {spec.pad})")
    if epilogue is not None:
        lines.append(f"    {epilogue.entry}({', '.join(epilogue.arg_names + [str(s) for s in epilogue.size_args])})")
    return "\n".join(lines) + "\n"


__all__ = ["prepare", "small_matmul", "default_config", "MatmulSpec", "MatmulTemplateKernel", "PaddedMatmul",
           "padded_matmul", "matmul_configs", "epilogue_group", "aten_candidate", "aten_matmul_out"]

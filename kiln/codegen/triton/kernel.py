"""One @triton.jit kernel (and its Python launcher) per KernelGroup (the IR walk: kiln/codegen/kernel.py).

Layout of a generated reduction kernel (softmax over rows of 64, persistent):

    @triton.jit
    def triton_fused_amax_exp_sum_0(arg0, buf3, xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]   # rows: the outer loops
        xmask = xindex < xnumel
        x0 = xindex
        rindex = tl.arange(0, RBLOCK)[None, :]                             # the reduced (inner) loops
        rmask = rindex < rnumel
        y0 = rindex
        mask = xmask & rmask
        tmp0 = tl.load(arg0 + (y0 + 64*x0), mask, other=0)                 # segment 0: the max
        buf0 = tl.reduce(tl.where(mask, tmp0, float('-inf')), 1, kiln_maximum)[:, None]
        ...                                                                # later segments reuse tmp0

Outer loop variables `x*` and inner `y*` are decomposed from the flat block
indices with // and %; every IR index expression (views, broadcasting) is
printed over them, and sizes that are symbols are kernel arguments. Loads and
stores are masked with the masks of the dims their index uses, so tails are
safe. A looped reduction wraps each inner segment in `for roffset in range(0,
rnumel, RBLOCK)`, keeping per-lane accumulators combined after the loop.
Half types are loaded to float32 and rounded after each op, as eager rounds.
"""
from __future__ import annotations

import sympy
import torch

from kiln.codegen.cse import Scope
from kiln.codegen.index_printer import _Printer, pyexpr
from kiln.codegen.kernel import KernelPrinter
from kiln.codegen.triton import ops
from kiln.codegen.triton.heuristics import LaunchConfig, choose, transposed_dim
from kiln.codegen.triton.libdevice import interpreting
from kiln.codegen.wrapper import ERROR_FLAG
from kiln.lower import ir
from kiln.lower.index import product
from kiln.schedule.fusion import KernelGroup


class TritonPrinter(_Printer):
    """Index expressions over block tensors: element-wise &, |, ~ and tl.minimum/maximum."""

    land, lor, lnot = " & ", " | ", "~"
    signed_floordiv = "kiln_floordiv({}, {})"  # Triton's // and % on integers truncate, as C's do
    signed_mod = "kiln_pymod({}, {})"

    def minmax(self, name, args) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"tl.{name}imum({out}, {a})"
        return out


texpr = TritonPrinter()


def decompose_index(flat: str, sizes, variables) -> list[str]:
    """`x0 = ...` lines splitting a flat block index into one variable per dim (row-major).

    A dim of size 0 leaves no element to index (every lane is masked), but Triton's compiler folds a division by
    a literal 0 and fails: such a dim divides by 1 instead."""
    lines, stride = [], sympy.Integer(1)
    n = len(sizes)
    for k in range(n - 1, -1, -1):
        v, s = variables[k], _nonzero(sizes[k])
        if n == 1:
            code = flat
        elif k == 0:
            code = f"{flat} // ({texpr(stride)})"
        elif stride == 1:
            code = f"{flat} % ({texpr(s)})"
        else:
            code = f"({flat} // ({texpr(stride)})) % ({texpr(s)})"
        lines.append(f"{v} = {code}")
        stride = stride * s
    return lines


def _nonzero(size):
    return sympy.Integer(1) if size == 0 else size


def _literal_value(code: str):
    """The Python value of a literal `ops.literal` printed (`0.5`, `-3`, `True`, `float('nan')`, negative zero)."""
    if code in ops.NEGATIVE_ZERO.values():
        return -0.0
    return eval(code, {"float": float})


def _loop_symbols(exprs) -> set:
    """Every symbol the indices, masks and index values inside `exprs` use (which loop variables a gather needs)."""
    return set().union(*(ir.index_symbols(root) for root in exprs))


class TritonKernel(KernelPrinter):
    takes_tensors = True  # the wrapper passes tensors (Triton reads data_ptr and dtype), not raw pointers
    COMPUTE = ops.COMPUTE

    def __init__(self, group: KernelGroup, layouts: dict, config: LaunchConfig | None = None, external=None,
                 unaligned=None):
        super().__init__(group, layouts)
        # buffers that may not be 16-byte aligned (graph inputs, views made by externs): the launcher checks
        # only these (None: all), as fresh allocations always are
        self.unaligned = unaligned
        self.config = config or choose(group, layouts)
        self.tile_dim = transposed_dim(group) if self.config.kind == "tiled" else None  # the tiles' row dim
        # persistent kernels keep every row in registers: a buffer no other step reads needs no store
        # (it is still an argument: the wrapper allocates and frees what the schedule stores)
        self.skip_store = set()
        if self.config.kind == "persistent" and external is not None:
            self.skip_store = self.stored - set(external)
        self._in_inner = False  # emitting an inner segment (values over rows x reduction lanes)
        self.xvars = set(group.outer_vars())
        self.yvars = set(group.inner_vars())
        # the launcher takes the group's name (what the wrapper calls); the kernel is named after it
        self.jit_name = f"triton_{group.name}"
        # max-autotune emits one launcher per candidate config: `entry` is the launcher's name, `launch_suffix`
        # tells its Launcher objects apart, `signature` (when set) is the argument order the entry takes
        self.entry = group.name
        self.launch_suffix = ""
        self.signature: list | None = None

    def mask_for(self, syms) -> str | None:
        """The block mask matching the loop variables an index uses."""
        uses_x = bool(syms & self.xvars)
        uses_y = bool(syms & self.yvars)
        if uses_x and uses_y:
            return "mask"
        if uses_y:
            return "rmask"
        if uses_x:
            return "xmask"
        return None

    # ------------------------------------------------------------------ the target's pieces of the walk
    def literal(self, value, dtype) -> str:
        return ops.literal(value, dtype)

    def index_value(self, e: ir.IndexValue) -> str:
        expr = sympy.sympify(e.expr)
        if not expr.free_symbols:
            v = bool(expr) if e.dtype == torch.bool else expr
            return self.lit(ops.literal(v, e.dtype))
        code = texpr(expr)
        if e.dtype != torch.bool:
            if not (expr.free_symbols & (self.xvars | self.yvars)):
                code = f"({code} + tl.zeros([1], tl.int64))"  # sizes only: make it a tensor
            code = f"({code}).to({ops.COMPUTE[e.dtype]})"
            if e.dtype in ops.ROUNDED:
                code = self.round_half(code, e.dtype)
        return code

    def round_half(self, code: str, dtype: torch.dtype) -> str:
        return f"{ops.to_half(code, dtype)}.to(tl.float32)"

    def declare(self, var: str, code: str, dtype: torch.dtype) -> str:
        return f"{var} = {code}"

    def template(self, e: ir.Op, args: list) -> str:
        """Triton's op table entry; literal operands made blocks where Triton would take them as scalars of the
        wrong type or has no scalar form (see `_literal_operands`)."""
        for k in self._literal_operands(e, args):
            args[k] = self._block(args[k], e.args[k].dtype)
        self._checks(e, args)
        return ops.OPS[e.name]

    def _block(self, code: str, dtype: torch.dtype) -> str:
        """`code` as a block of `dtype`'s compute type if it is a literal (Triton takes a literal as a scalar, and
        a Python int as int32 where it fits), else `code`."""
        return f"tl.full([1], {code}, {ops.COMPUTE[dtype]})" if code in self.literals else code

    def _literal_operands(self, e: ir.Op, args: list) -> list[int]:
        """The operands of `e` to make blocks: the first of an op over literals only (exp(2.0): a scalar has
        no exp), a literal first operand of an op Triton calls as a function (helpers read its dtype: 2.0 ** x,
        7 // x), every literal operand of a libdevice function of two (`ops.LIBDEVICE_BINARY`), and both values of
        a where between literals (Triton would pick int32 or float32 for them, not the where's dtype)."""
        literal = [a in self.literals for a in args]
        if e.name == "where":
            return [1, 2] if literal[1] and literal[2] else []
        if e.name in ops.LIBDEVICE_BINARY:
            return [k for k, is_literal in enumerate(literal) if is_literal]
        if all(literal) or (literal[0] and e.name not in ops.INFIX):
            return [0]
        return []

    def _checks(self, e: ir.Op, args: list) -> None:
        """Report what eager rejects among `e`'s operands: an index out of range (`check_index`), and under
        the interpreter an integer divisor of 0 (eager raises on CPU tensors; on the GPU it does not)."""
        if e.name == "check_index":
            self._report(f"({args[0]} < 0) | ({args[0]} >= {args[1]})", args[2], e.args[0])
        elif e.name in ir.CHECKED_DIVISIONS and not e.args[0].dtype.is_floating_point and interpreting():
            self._report(f"{args[1]} == 0", ir.ZERO_DIVISION, e.args[1])

    def _report(self, bad: str, code, operand: ir.Expr) -> None:
        """Store `code` in the error flag where `bad` holds, in the lanes the kernel computes (`operand`'s
        loop variables say which: masked-off lanes load zeros)."""
        self.inputs[ERROR_FLAG] = None
        mask = self.mask_for(_loop_symbols([operand]))
        flag = self.new_tmp("bad")
        self.line(f"{flag} = (tl.full([1], 0, tl.int1) | ({bad})){f' & {mask}' if mask else ''}")
        self.line(f"tl.store({ERROR_FLAG} + {flag}.to(tl.int32) * 0, {code}, {flag})")

    def cast(self, x: str, src: torch.dtype, dst: torch.dtype) -> str:
        if src == dst:
            return x
        if x in self.literals:  # folded here, to the value eager's conversion gives
            return self.lit(ops.literal(ir.converted(_literal_value(x), src, dst), dst))
        if dst == torch.bool:
            return f"({x} != 0)"
        if dst in ops.ROUNDED:  # eager converts to float first (c10's Half and BFloat16 take a float): a
            # float64 or int64 value is rounded twice, which differs from once at a tie of the float value
            x = x if src == torch.float32 or src in ops.ROUNDED else f"{x}.to(tl.float32)"
            return self.round_half(x, dst)
        if src in ops.ROUNDED and ops.COMPUTE[dst] == "tl.float32":
            return x
        return f"{x}.to({ops.COMPUTE[dst]})"

    def load_code(self, e: ir.Load, index) -> str:
        syms = index.free_symbols | (e.mask.free_symbols if e.mask is not None else set())
        if e.indirect:  # the gathered index values' own loop variables decide the mask too
            syms |= _loop_symbols([x for _, x in e.indirect])
        masks = [m for m in [self.mask_for(syms)] if m]
        if e.mask is not None:
            masks.append(texpr(e.mask))
        ptr = texpr(index)
        if masks:  # the pointer block spans the mask's loops: Triton refuses a scalar pointer under a block mask
            if syms & self.xvars and not index.free_symbols & self.xvars:
                ptr = f"{ptr} + 0 * xindex"
            if syms & self.yvars and not index.free_symbols & self.yvars:
                ptr = f"{ptr} + 0 * rindex"
        code = f"tl.load({e.buf} + ({ptr})"
        code += f", {' & '.join(masks)}, other=0)" if masks else ")"
        if e.dtype in ops.ROUNDED:
            code += ".to(tl.float32)"
        return code

    def store_code(self, node: ir.ComputedBuffer, index, var: str, dtype: torch.dtype) -> None:
        if node.name in self.skip_store:
            self.line(f"# {node.name} stays in registers (read only inside this kernel)")
            return
        lay = node.layout
        if var in self.literals:  # a constant: Triton stores blocks, not scalars
            v = self._block(ops.literal(ir.converted(_literal_value(var), dtype, lay.dtype), lay.dtype), lay.dtype)
            if lay.dtype in ops.ROUNDED:  # exact: the value is one of the half type's
                v = f"{v}.to({ops.STORAGE[lay.dtype]})"
        else:
            v = self.cast(var, dtype, lay.dtype)
            if lay.dtype in ops.ROUNDED:
                v = ops.to_half(v, lay.dtype)
        syms = index.free_symbols
        ptr = texpr(index)
        # the pointer block must have the shape of the value's loop nest (a full reduction stores at offset 0;
        # a tiled kernel's values are whole tiles)
        inner = (self._in_inner and not node.is_reduction()) or self.config.kind == "tiled"
        if not syms & self.xvars:
            ptr = f"{ptr} + 0 * xindex"
        if inner and not syms & self.yvars:
            ptr = f"{ptr} + 0 * rindex"
        mask = "mask" if inner else "xmask"
        self.line(f"tl.store({node.name} + ({ptr}), {v}, {mask})")

    # ------------------------------------------------------------------ the kernel
    def generate(self) -> str:
        g, cfg = self.group, self.config
        self._in_inner = False
        reduction = bool(g.inner)
        tiled = cfg.kind == "tiled"
        # a tiled kernel's xindex runs down axis 0 as a reduction's does (see `_tile_rows`)
        xshape = "[:, None]" if reduction or tiled else ""
        pid = "tl.program_id(0)" if cfg.index_dtype == "tl.int32" else "tl.program_id(0).to(tl.int64)"
        self.line(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK){xshape}")
        self.line("xmask = xindex < xnumel")
        if tiled:
            self._tile_rows()
        else:
            for s in decompose_index("xindex", g.outer, list(g.outer_vars())):
                self.line(s)
        outer_scope = Scope()
        persistent_scope = None
        if cfg.kind == "persistent":
            self._rindex("tl.arange(0, RBLOCK)[None, :]")
            persistent_scope = Scope(outer_scope)
        for k, seg in enumerate(g.segments):
            self.line(f"# segment {k} ({'inner' if seg.inner else 'outer'}): {', '.join(n.name for n in seg.nodes)}")
            if not seg.inner:
                self._outer_segment(seg, persistent_scope or outer_scope)
            elif cfg.kind == "persistent":
                self._persistent_segment(seg, persistent_scope)
            else:
                self._looped_segment(seg, outer_scope)
        body = self.lines
        self._arguments()
        params = self.arg_names + [str(s) for s in self.size_args] + ["xnumel"]
        if reduction or tiled:
            params.append("rnumel")
        params.append("XBLOCK: tl.constexpr")
        if reduction or tiled:
            params.append("RBLOCK: tl.constexpr")
        head = ["@triton.jit", f"def {self.jit_name}({', '.join(params)}):",
                f'    """{self._docstring()}"""']
        self.jit_source = "\n".join(head + body)
        return self.jit_source + "\n\n\n" + self._launcher()

    def _docstring(self) -> str:
        g, cfg = self.group, self.config
        shape = f"outer ({', '.join(map(str, g.outer))})"
        if g.inner:
            shape += f" x inner ({', '.join(map(str, g.inner))})"
        return f"{cfg.kind} kernel over {shape}: " + ", ".join(n.name for n in g.nodes)

    def _tile_rows(self) -> None:
        """A tiled kernel's loop variables: the transposed dim from `rindex` (axis 1), the others from
        `xindex` (axis 0). The transposed dim's variable counts as a `y` variable, so an index using it is
        masked with `rmask`.

        Why the stores' dims go on axis 0: Triton lays a memory access out with its threads along the axis of
        provable contiguity, and breaks a tie towards axis 0. The loads walk `rindex` (an arange: provably
        contiguous), but a store whose last dim is merged into `xindex` at a size that is not a power of two
        (Swin's 49-token windows: `xindex % 49`) proves no contiguity; on axis 1 it got a warp's threads along
        the rows, each store a row apart."""
        g, t = self.group, self.tile_dim
        variables = list(g.outer_vars())
        others = [k for k in range(len(g.outer)) if k != t]
        for s in decompose_index("xindex", [g.outer[k] for k in others], [variables[k] for k in others]):
            self.line(s)
        pid = "tl.program_id(1)" if self.config.index_dtype == "tl.int32" else "tl.program_id(1).to(tl.int64)"
        self.line(f"rindex = {pid} * RBLOCK + tl.arange(0, RBLOCK)[None, :]")
        self.line("rmask = rindex < rnumel")
        self.line(f"{variables[t]} = rindex")
        self.line("mask = xmask & rmask")
        self.xvars.discard(variables[t])
        self.yvars.add(variables[t])

    def _rindex(self, start: str) -> None:
        g = self.group
        self.line(f"rindex = {start}")
        self.line("rmask = rindex < rnumel")
        for s in decompose_index("rindex", g.inner, list(g.inner_vars())):
            self.line(s)
        self.line("mask = xmask & rmask")

    def example_args(self) -> tuple[list, list]:
        """(dtype of each tensor argument, a value for each integer argument) for `Launcher.precompile`."""
        dtypes = [self.layouts[b].dtype for b in self.arg_names]
        numels = list(self._numels())
        ints = [int(v) if sympy.sympify(v).is_Integer else 2 for v in list(self.size_args) + numels]
        return dtypes, ints

    def precompile(self, module) -> None:
        """Compile the kernel now, where a failure can still fall back to ATen."""
        getattr(module, f"_launch_{self.jit_name}{self.launch_suffix}").precompile(*self.example_args())

    def _numels(self) -> tuple:
        """(xnumel, rnumel): the sizes the two block indices run over (rnumel only for reductions and tiles)."""
        g = self.group
        if self.tile_dim is not None:
            t = g.outer[self.tile_dim]
            return sympy.sympify(product(g.outer)) / t, t
        return (product(g.outer), product(g.inner)) if g.inner else (product(g.outer),)

    def _launcher(self) -> str:
        cfg = self.config
        sizes = [str(s) for s in self.size_args]
        numels = self._numels()
        lines = [f"def {self.entry}({', '.join((self.signature or self.arg_names) + sizes)}):"]
        kw = f"XBLOCK={cfg.XBLOCK}" + (f", RBLOCK={cfg.RBLOCK}" if len(numels) > 1 else "")
        if all(sympy.sympify(n).is_Integer for n in numels):
            lines += self._static_launch(sizes, [int(n) for n in numels])
        else:
            lines += self._dynamic_launch(sizes, numels)
        check = "" if self.unaligned is None else \
            f"check_alignment={tuple(k for k, a in enumerate(self.arg_names) if a in self.unaligned)}, "
        launcher = (f"_launch_{self.jit_name}{self.launch_suffix} = Launcher({self.jit_name}, {len(self.arg_names)}, "
                    f"num_warps={cfg.num_warps}, {check}{kw})")
        return launcher + "\n\n\n" + "\n".join(lines) + "\n"

    def _static_launch(self, sizes: list[str], numels: list[int]) -> list[str]:
        """The launch of a kernel of static sizes: the grid and the numels as numbers (every launch runs this
        Python: nothing left to compute per call), or nothing for an empty range."""
        cfg = self.config
        if numels[0] <= 0:
            return ["    return"]
        grid = str(-(-numels[0] // cfg.XBLOCK))
        if cfg.kind == "tiled":
            grid = f"({grid}, {-(-numels[1] // cfg.RBLOCK)})"
        args = self.arg_names + sizes + [str(n) for n in numels]
        return [f"    _launch_{self.jit_name}{self.launch_suffix}({grid}, {', '.join(args)})"]

    def _dynamic_launch(self, sizes: list[str], numels: tuple) -> list[str]:
        """The launch of a kernel whose sizes are symbols bound by the wrapper: grid computed per call."""
        cfg = self.config
        lines = [f"    xnumel = {pyexpr(numels[0])}"]
        args = self.arg_names + sizes + ["xnumel"]
        if len(numels) > 1:
            lines.append(f"    rnumel = {pyexpr(numels[1])}")
            args.append("rnumel")
        lines += ["    if xnumel <= 0:", "        return"]
        grid = f"(xnumel + {cfg.XBLOCK - 1}) // {cfg.XBLOCK}"
        if cfg.kind == "tiled":
            grid = f"({grid}, (rnumel + {cfg.RBLOCK - 1}) // {cfg.RBLOCK})"
        lines.append(f"    _launch_{self.jit_name}{self.launch_suffix}({grid}, {', '.join(args)})")
        return lines

    # ------------------------------------------------------------------ segments
    def _outer_segment(self, seg, scope: Scope) -> None:
        self._in_inner = False  # after a persistent segment: values over rows only again
        super()._outer_segment(seg, scope)

    def _reduction_keys(self, seg):
        """Reductions of a segment grouped by (family, body): welford mean and m2 of one input share work."""
        keys = {}
        for node in seg.nodes:
            if node.is_reduction():
                family = node.data.family
                keys.setdefault((family, self._mapped(node)), []).append(node)
        return keys

    def _persistent_segment(self, seg, scope: Scope) -> None:
        self._in_inner = True
        done: dict = {}
        for node in seg.nodes:
            body = self._mapped(node)
            var = self.emit(body, scope)
            if not node.is_reduction():
                self._store(node, var, body.dtype)
                continue
            var = self._block(var, body.dtype)  # a reduced constant: its lanes in its dtype, not int32/float32
            rtype = node.data.reduction_type
            family = node.data.family
            key = (family, body)
            if key not in done:
                done[key] = self._reduce_block(family, var, body.dtype)
            result = done[key][rtype] if family == "welford" else done[key]
            self._store(node, result, node.layout.dtype if family in ("argmax", "argmin") else body.dtype)

    def _reduce_block(self, family: str, v: str, dtype: torch.dtype):
        """Reduce a [XBLOCK, RBLOCK] block along the rows; the result is [XBLOCK, 1]."""
        t = ops.COMPUTE[dtype]
        out = self.new_tmp("red")
        if family == "welford":
            s = self.new_tmp("red")
            self.line(f"{s} = tl.sum(tl.where(mask, {v}, 0.0), 1)[:, None]")
            self.line(f"{out}_mean = {s} / rnumel")
            self.line(f"{out}_delta = tl.where(mask, {v} - {out}_mean, 0.0)")
            self.line(f"{out}_m2 = tl.sum({out}_delta * {out}_delta, 1)[:, None]")
            return {"welford_mean": f"{out}_mean", "welford_m2": f"{out}_m2"}
        masked = f"tl.where(mask, {v}, {ops.identity(family, dtype)})"
        if family in ("argmax", "argmin"):
            idx = "tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64)"
            self.line(f"_, {out} = tl.reduce(({masked}, {idx}), 1, kiln_{family}_combine)")
            self.line(f"{out} = {out}[:, None]")
            return out
        if family in ("sum", "prod") and t == "tl.int1":
            masked = f"{masked}.to(tl.int64)"
        self.line(f"{out} = {ops.REDUCE_BLOCK[family].format(v=masked)}[:, None]")
        return out

    def _looped_segment(self, seg, outer_scope: Scope) -> None:
        self._in_inner = True
        keys = self._reduction_keys(seg)
        accs = {}
        for key, nodes in keys.items():
            family = key[0]
            dtype = nodes[0].data.body.dtype
            t = ops.COMPUTE[dtype]
            acc = self.new_tmp("acc")
            accs[key] = acc
            if family == "welford":  # in the body's compute type: a float64 variance accumulates in float64
                for part in ("mean", "m2", "weight"):
                    self.line(f"{acc}_{part} = tl.zeros([XBLOCK, RBLOCK], {t})")
            else:
                self.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {ops.identity(family, dtype)}, {t})")
                if family in ("argmax", "argmin"):
                    self.line(f"{acc}_index = tl.full([XBLOCK, RBLOCK], {2**63 - 1}, tl.int64)")
        self.line(f"for roffset in {self._loop_range()}:")
        self.indent += 1
        self._rindex("roffset + tl.arange(0, RBLOCK)[None, :]")
        scope = Scope(outer_scope)
        saved = dict(self.values)
        updated = set()
        for node in seg.nodes:
            body = self._mapped(node)
            var = self.emit(body, scope)
            if not node.is_reduction():
                self._store(node, var, body.dtype)
                continue
            var = self._block(var, body.dtype)  # a reduced constant: its lanes in its dtype, not int32/float32
            family = node.data.family
            acc = accs[(family, body)]
            if acc in updated:
                continue
            updated.add(acc)
            if family == "welford":
                self.line(f"{acc}_mean, {acc}_m2, {acc}_weight = kiln_welford_update("
                          f"{acc}_mean, {acc}_m2, {acc}_weight, {var}, mask)")
            elif family in ("argmax", "argmin"):
                self.line(f"{acc}_next, {acc}_next_index = kiln_{family}_combine("
                          f"{acc}, {acc}_index, {var}, rindex.to(tl.int64))")
                self.line(f"{acc} = tl.where(mask, {acc}_next, {acc})")
                self.line(f"{acc}_index = tl.where(mask, {acc}_next_index, {acc}_index)")
            else:
                self.line(f"{acc} = tl.where(mask, {ops.ACCUMULATE[family].format(a=acc, v=var)}, {acc})")
        self.indent -= 1
        self._forget_values_since(saved)  # values computed inside the loop do not outlive it
        self._finish_looped(keys, {key: self._lane_combine(key[0], acc) for key, acc in accs.items()})
        self._in_inner = False

    def _loop_range(self) -> str:
        return "range(0, rnumel, RBLOCK)"

    def _lane_combine(self, family: str, acc: str) -> dict:
        """Combine a looped reduction's per-lane accumulators along the rows: {part: [XBLOCK, 1] variable}."""
        out = self.new_tmp("red")
        if family == "welford":
            self.line(f"{out}_mean, {out}_m2, {out}_weight = tl.reduce(({acc}_mean, {acc}_m2, {acc}_weight), 1, "
                      "kiln_welford_combine)")
            parts = {"mean": f"{out}_mean", "m2": f"{out}_m2", "weight": f"{out}_weight"}
        elif family in ("argmax", "argmin"):
            self.line(f"{out}_value, {out}_index = tl.reduce(({acc}, {acc}_index), 1, kiln_{family}_combine)")
            parts = {"value": f"{out}_value", "index": f"{out}_index"}
        else:
            self.line(f"{out} = {ops.REDUCE_BLOCK[family].format(v=acc)}")
            parts = {"value": out}
        for var in parts.values():
            self.line(f"{var} = {var}[:, None]")
        return parts

    def _finish_looped(self, keys: dict, results: dict) -> None:
        """Store each reduction's result (and keep it in registers for the segments after)."""
        for key, nodes in keys.items():
            for node in nodes:
                result = reduction_result(results[key], node.data.reduction_type)
                self._store(node, result, reduction_result_dtype(node))


_PART = {"welford_mean": "mean", "welford_m2": "m2", "argmax": "index", "argmin": "index"}


def reduction_result(parts: dict, rtype: str) -> str:
    return parts[_PART.get(rtype, "value")]


def reduction_result_dtype(node) -> torch.dtype:
    return node.layout.dtype if node.data.reduction_type in ("argmax", "argmin") else node.data.body.dtype


__all__ = ["TritonKernel", "texpr"]

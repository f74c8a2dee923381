"""Lowering an ATen FX graph to the loop-level IR (`LoweredGraph`).

Walks the graph once. Each node goes through the lowering registry
(`kiln.lower.ops.LOWERINGS`, one rule per ATen op); a node with no rule, or whose
rule raises `Unsupported`, becomes an `Extern` ATen call on realized inputs.
Pointwise results stay unrealized (an index function) and are inlined into their
consumers; they are realized into buffers when an extern or the output needs
memory, or when several consumers would each recompute non-trivial work.
"""
from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map

from kiln.lower import ir
from kiln.lower.conv_layout import channels_last_values
from kiln.lower.host_work import crosses_to, host_work
from kiln.lower.index import (
    PrecomputedSizes,
    affine_strides,
    contiguous_strides,
    index_vars,
    precomputing,
    proven,
    sympify,
)
from kiln.lower.layout import dense_strides, matmul_operand_strides, padded
from kiln.lower.ops import LOWERINGS
from kiln.lower.scalar_operands import eager_reads, host_scalar_operands
from kiln.lower.shape_padding import padded_result_strides, pads
from kiln.lower.sym_floats import SYM_FLOAT_OPS, reads_size_scalars, sym_float_value, wrapper_float
from kiln.lower.values import IndexFunction, SizeScalar, Unsupported, from_buffer

log = logging.getLogger("kiln.lower")


class _SizeFloat:
    """What a float node computed from sizes lowers to (`n / 2` in `math.ceil(n / 2)`): nothing a kernel reads.
    The size computed from it is lowered from its own expression (`_sym`); a kernel or output that would read
    the float itself is unsupported (the graph runs through ATen), never a constant."""

    def __repr__(self) -> str:
        return "<a float computed from sizes>"


SIZE_FLOAT = _SizeFloat()

# An unrealized body bigger than this is realized (bounds kernel size and compile time).
MAX_INLINE_SIZE = 120
# A body this small is recomputed by each of its users rather than realized when that reads no more
# memory than the buffer would (relu's backward `where(x <= 0, 0, grad)`, read by batch norm's backward
# reduction and pointwise: realized, a deep CNN's backward gets one kernel per such mask).
RECOMPUTE_SIZE = 8
# A body that reads no tensor at full size (every load misses one of its dims, like cross-entropy's
# one-hot gradient `where(target[i] == j, -1, 0) * scale`) is recomputed up to this size: realizing it
# writes and reads a full tensor ([tokens, vocabulary] fp32 for a language model's loss) to save a
# few arithmetic ops.
BROADCAST_RECOMPUTE_SIZE = 32

aten = torch.ops.aten
# Externs that take operands in any stride order at no cost (cuBLAS transposes for free): an unrealized
# operand is written in the order of its own loads (a transposed weight cast is a coalesced copy, not a
# strided scatter).
MATMUL_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})
ANY_ORDER_EXTERNS = MATMUL_OPS | {aten.baddbmm.default}
# A buffer whose rows are at least this long, at an unaligned length, is stored with rows padded to
# PAD_ROW_BYTES (zeros in the padding) when a matmul reads it on the GPU (`pad_matmul_operands`): cuBLAS
# runs its fast kernels only on aligned leading dimensions, and a K operand must also be a multiple of 8
# long. A language model's logits gradient at an odd vocabulary size is the case: both of its matmuls
# read the padded rows instead of an F.pad copy (benchmarks/padded_strides.py measures it).
PAD_MIN_COLUMNS = 1024
PAD_ROW_BYTES = 128
# FX ops whose result is a view: a value reaches an extern or the output through them unchanged.
VIEW_OPS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
                      aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
                      aten.squeeze.default, aten.slice.Tensor, aten.select.int, aten.t.default,
                      aten.transpose.int, aten.alias.default, operator.getitem})


class GraphLowering:
    """The lowering context, passed explicitly to every lowering rule."""

    def __init__(self, gm: torch.fx.GraphModule, pad_matmul_operands: bool = False, channels_last_convs: bool = False,
                 through_aten: frozenset = frozenset()):
        self.gm = gm
        self.through_aten = through_aten  # FX node names run as externs, lowering or not (a kernel fell back)
        self.host_work = host_work(gm)  # FX node names run as ATen externs on the CPU, as eager runs them
        self._crossed: dict[torch.fx.Node, Any] = {}  # a 0-d CPU value -> its copy on the GPU (`_read`)
        self.origins: dict[str, frozenset] = {}  # buffer -> the FX nodes whose values it computes
        self._current: torch.fx.Node | None = None  # the FX node being lowered
        self._extern_args = False  # realizing the arguments of an extern call of `_current`
        self._env: dict = {}
        self._inlined_memo: dict[torch.fx.Node, frozenset] = {}  # see `_inlined`
        self.pad_matmul_operands = pad_matmul_operands
        self.channels_last_convs = channels_last_convs
        # the FX nodes whose 4-d values are stored channels-last when realized (kiln/lower/conv_layout.py)
        self.channels_last_values = channels_last_values(gm) if channels_last_convs else set()
        self.zero_padded: dict[str, int] = {}  # buffer -> its logical last size (the rest of each row is 0)
        self.nodes: list[ir.Node] = []
        self.layouts: dict[str, ir.Layout] = {}
        self.empty: set[str] = set()  # the buffers of `layouts` with no element (a size 0), kept with it
        self.inputs: list = []
        self.size_vars: dict = {}
        self.precomputed = PrecomputedSizes()  # sizes the wrapper computes through floats
        self.constants: dict[str, torch.Tensor] = {}
        self.shape_env = None  # the shape environment of the inputs' symbols (a dynamic graph), see `known`
        self._count = 0
        self.padded_results: set[str] = set()  # matmul results with padded rows (`_padded_result`)
        # buffer -> the buffer whose memory it is on: an extern's result that aliases its first tensor argument (an
        # as_strided or a dtype view the lowering leaves to ATen) is on that argument's memory
        self.memory_of: dict[str, str] = {}
        self.computed_reductions: dict[tuple, str] = {}  # a reduction's key -> its buffer (lower/ops/reductions.py)
        self._returned = _returned_nodes(gm)  # FX node -> "visible" or "saved" (see `_maybe_realize`)

    # -- naming and buffers
    def new_name(self, prefix: str = "buf") -> str:
        self._count += 1
        return f"{prefix}{self._count - 1}"

    def current_argument(self, k: int) -> torch.fx.Node | None:
        """The FX node of argument `k` of the node being lowered (None if that argument is no node): where a rule
        needs what eager knows of an input beyond its value, its producer and its meta layout."""
        arg = self._current.args[k] if self._current is not None and k < len(self._current.args) else None
        return arg if isinstance(arg, torch.fx.Node) else None

    def add_buffer(self, node: ir.Node) -> None:
        if isinstance(node, ir.ComputedBuffer):
            node = self._without_empty_reads(node)
        self.nodes.append(node)
        self._note_memory(node)
        if self._current is not None:
            self.origins[node.name] = self._origins(node)
        if isinstance(node, (ir.ComputedBuffer, ir.MultiOutput)):
            self._set_layout(node.name, node.layout)
        elif isinstance(node, ir.Extern) and isinstance(node.layout, ir.Layout):
            self._set_layout(node.name, node.layout)

    def _set_layout(self, name: str, layout: ir.Layout) -> None:
        """Record buffer `name`'s layout, and whether it holds no element: each new buffer reads the set of those
        (`_without_empty_reads`), which a scan of every layout so far made quadratic in the graph's size (a
        second of BART's lowering)."""
        self.layouts[name] = layout
        if any(s == 0 for s in layout.size):
            self.empty.add(name)
        else:
            self.empty.discard(name)

    def _without_empty_reads(self, node: ir.ComputedBuffer) -> ir.ComputedBuffer:
        """`node` reading 0 where it would load from a buffer of no element (ir.without_empty_reads)."""
        empty = frozenset(self.empty)
        body = ir.without_empty_reads(node.data.body, empty) if empty else node.data.body
        if body is node.data.body:
            return node
        return ir.ComputedBuffer(node.name, node.layout, dataclasses.replace(node.data, body=body))

    def _note_memory(self, node: ir.Node) -> None:
        if isinstance(node, ir.Extern) and node.aliases_inputs:
            first = next((a for a in node.args if isinstance(a, ir.TensorRef)), None)
            if first is not None:
                self.memory_of[node.name] = self.memory_of.get(first.buf, first.buf)
        elif isinstance(node, ir.MultiOutput) and node.source in self.memory_of:
            self.memory_of[node.name] = self.memory_of[node.source]

    def realize(self, v: IndexFunction, stride=None) -> IndexFunction:
        """`v` backed by memory: a view of an existing buffer if it is one, else a new buffer.

        Strides that are a permutation of a dense layout (a transposed or channels-last result) store a
        buffer whose dims are in memory order, computed in that order (coalesced writes), and return the
        permuted view of it."""
        if stride is None and v.buffer_view() is not None:
            return v
        layout = ir.Layout(tuple(v.size), tuple(stride) if stride else contiguous_strides(v.size), v.dtype)
        order = _memory_order(layout)
        name = self.new_name()
        if order is None:
            self.add_buffer(ir.ComputedBuffer(name, layout, ir.Pointwise(tuple(v.size), v.body)))
            return from_buffer(name, layout)
        position = {d: k for k, d in enumerate(order)}
        variables = index_vars("i", v.ndim)
        sizes, body = merged_copy_dims([v.size[d] for d in order],
                                       v.at([variables[position[d]] for d in range(v.ndim)]))
        storage = ir.Layout.contiguous(sizes, v.dtype)
        self.add_buffer(ir.ComputedBuffer(name, storage, ir.Pointwise(storage.size, body)))
        return from_buffer(name, layout)

    def realize_zero_padded(self, v: IndexFunction) -> IndexFunction:
        """`v` in a new buffer whose rows are padded with zeros to a multiple of PAD_ROW_BYTES: a matmul
        reads it with an aligned leading dimension, or, as its K operand, whole padded rows."""
        n, itemsize = int(v.size[-1]), v.dtype.itemsize
        wide = -(-n * itemsize // PAD_ROW_BYTES) * PAD_ROW_BYTES // itemsize
        storage = ir.Layout.contiguous(tuple(v.size[:-1]) + (sympy.Integer(wide),), v.dtype)
        body = padded(v, [0, wide - n], storage.size, v.dtype).body
        name = self.new_name()
        self.add_buffer(ir.ComputedBuffer(name, storage, ir.Pointwise(storage.size, body)))
        self.zero_padded[name] = n
        return from_buffer(name, ir.Layout(tuple(v.size), storage.stride, v.dtype))

    def _pads(self, v: IndexFunction) -> bool:
        """Whether `v`, read by a matmul, is worth storing with zero-padded rows (see PAD_ROW_BYTES)."""
        last = sympy.sympify(v.size[-1]) if v.ndim >= 2 else None
        return (self.pad_matmul_operands and last is not None and last.is_Integer and v.dtype.is_floating_point
                and int(last) >= PAD_MIN_COLUMNS and int(last) * v.dtype.itemsize % PAD_ROW_BYTES != 0)

    def ref(self, v: IndexFunction, any_order: bool = False) -> ir.TensorRef:
        """An extern argument for `v`: the buffer itself, or an as_strided view of one. With `any_order`
        (a matmul) a computed `v` is stored in the order of its loads, or with zero-padded rows."""
        if any_order and v.buffer_view() is None:
            stride = matmul_operand_strides(v)
            v = self.realize_zero_padded(v) if stride is None and self._pads(v) else self.realize(v, stride)
        v = self.realize(v)
        buf, offset, strides = v.buffer_view()
        base = self.layouts[buf]
        layout = ir.Layout(tuple(v.size), tuple(strides), v.dtype, offset)
        same = tuple(base.size) == layout.size and tuple(base.stride) == layout.stride and offset == base.offset
        return ir.TensorRef(buf, base if same else layout, view=not same)

    # -- the walk
    def run(self, example_inputs) -> ir.LoweredGraph:
        with precomputing(self.precomputed):
            lowered = self._run(example_inputs)
        self.precomputed.bind_formulas(self.size_vars)
        return lowered

    def _run(self, example_inputs) -> ir.LoweredGraph:
        env: dict[torch.fx.Node, Any] = self._env
        outputs = None
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for node, example in zip(placeholders, example_inputs):
            # the traced metadata carries symbolic sizes where the example inputs are concrete
            env[node] = self._placeholder(node, node.meta.get("val", example))
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                env[node] = self._constant(node)
                continue
            self._current = node
            if node.op == "output":
                outputs = self._outputs(node, _input_owners(placeholders, example_inputs, self.inputs))
                continue
            env[node] = self._call(node, env)
        nodes = _without_unread_items(self.nodes, outputs)
        return ir.LoweredGraph(self.inputs, nodes, outputs, self.size_vars, self.constants, self.zero_padded,
                               self.origins, self.through_aten | self.host_work)

    def _origins(self, node: ir.Node) -> frozenset:
        """The FX nodes whose computation `node` (a buffer added while lowering `self._current`) holds:
        running them as externs takes its body out of the kernels. An extern call holds its own op; an
        argument realized for it, what is inlined into that argument; any other buffer, the current op
        and what is inlined into it."""
        current = self._current
        if isinstance(node, (ir.Extern, ir.MultiOutput)):
            return frozenset({current.name} if current.op == "call_function" else ())
        contributors = self._contributors(current)
        return contributors - {current.name} if self._extern_args else contributors

    def _contributors(self, node: torch.fx.Node) -> frozenset:
        """`node` and, through its inputs that are still unrealized (index functions inlined into it),
        the FX nodes those compute."""
        own = {node.name} if node.op == "call_function" else set()
        return frozenset(own.union(*(self._inlined(a) for a in node.all_input_nodes if self._unrealized(a))))

    def _unrealized(self, node: torch.fx.Node) -> bool:
        """Whether `node`'s lowered value is an index function with no buffer behind it (inlined where read)."""
        v = self._env.get(node)
        return isinstance(v, IndexFunction) and v.buffer_view() is None

    def _inlined(self, node: torch.fx.Node) -> frozenset:
        """The FX nodes computed inline in lowered `node`'s unrealized value: itself and, recursively, its
        unrealized inputs. Memoized, since a lowered node's value never changes and every buffer realized
        downstream asks again (without it, a graph's outputs or a long chain of concatenations walked the
        same nodes once per buffer: quadratic). Iterative: an inlined chain may be deeper than Python's
        recursion limit."""
        memo = self._inlined_memo
        stack = [node]
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            inputs = [a for a in n.all_input_nodes if self._unrealized(a)]
            missing = [a for a in inputs if a not in memo]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            memo[n] = frozenset(({n.name} if n.op == "call_function" else set()).union(*(memo[a] for a in inputs)))
        return memo[node]

    def _constant(self, node):
        """A tensor attribute of the graph module: an input the wrapper binds once, at load time."""
        value = getattr(self.gm, node.target)
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"get_attr of a {type(value).__name__}")
        name = f"const{len(self.constants)}"
        layout = ir.Layout(tuple(sympify(s) for s in value.shape), tuple(sympify(s) for s in value.stride()),
                           value.dtype)
        self.constants[name] = value
        self._set_layout(name, layout)
        return from_buffer(name, layout)

    def known(self, relation) -> bool | None:
        """Whether `relation` over the graph's symbols holds on every call the guards admit: True, False, or None
        where they leave it open. An int input's symbol may be negative (a size's never is): where an index
        counts from the end decides which elements are read, and tracing the op fixed its sign by a guard."""
        relation = sympy.sympify(relation)
        if relation in (sympy.true, sympy.false):
            return bool(relation)
        if self.shape_env is None:
            return None
        return proven(self.shape_env, self.precomputed.defined(relation))  # None: the caller's code serves every case

    def decide(self, relation) -> bool | None:
        """`relation` where the guards fix it; where they leave it open, its value at the sizes being compiled,
        which becomes a size guard of the graph (a call that fails it compiles again, and decides again). For a
        choice between two correct lowerings by cost (a dense scatter's compares) that must not be made blind:
        None only for a graph with no shape environment."""
        known = self.known(relation)
        if known is not None or self.shape_env is None:
            return known
        return bool(self.shape_env.evaluate_expr(self.precomputed.defined(sympy.sympify(relation))))

    def _note_shape_env(self, values) -> None:
        for v in values:
            if isinstance(v, torch.SymInt) and self.shape_env is None:
                self.shape_env = v.node.shape_env

    def _placeholder(self, node, example):
        self._note_shape_env(example.shape if isinstance(example, torch.Tensor) else (example,))
        if isinstance(example, torch.Tensor):
            size = tuple(sympify(s) for s in example.shape)
            stride = tuple(sympify(s) for s in example.stride())
            layout = ir.Layout(size, stride, example.dtype)
            name = f"arg{len(self.inputs)}"
            self.inputs.append(ir.InputBuffer(name, layout))
            self._set_layout(name, layout)
            for d, s in enumerate(size):
                if isinstance(s, sympy.Symbol):
                    self.size_vars.setdefault(s, f"{name}.size({d})")
            for d, s in enumerate(stride):
                if isinstance(s, sympy.Symbol):
                    self.size_vars.setdefault(s, f"{name}.stride({d})")
            return from_buffer(name, layout)
        expr = sympify(example) if isinstance(example, (int, torch.SymInt)) else None
        if expr is None:
            raise Unsupported(f"graph input of type {type(example).__name__}")
        name = f"arg{len(self.inputs)}"
        self.inputs.append(ir.SymInput(name, expr))
        if isinstance(expr, sympy.Symbol):
            self.size_vars.setdefault(expr, name)
        return expr

    def _call(self, node: torch.fx.Node, env):
        meta = node.meta.get("val")
        args = tree_map(lambda n: self._read(n, env, node) if isinstance(n, torch.fx.Node) else n, node.args)
        kwargs = tree_map(lambda n: self._read(n, env, node) if isinstance(n, torch.fx.Node) else n, node.kwargs)
        if node.target is operator.getitem:
            return args[0][args[1]]
        if (isinstance(meta, (torch.SymInt, int)) and not isinstance(meta, bool)
                and not isinstance(node.target, torch._ops.OpOverload)):
            return self._sym(meta)
        if isinstance(meta, torch.SymInt):
            return self._sym(meta)
        if isinstance(meta, torch.SymFloat) and node.target in SYM_FLOAT_OPS:
            return sym_float_value(node.target, args)  # a float kernels read: a 0-d value computed from sizes
        if isinstance(meta, (torch.SymFloat, float)) and not isinstance(node.target, torch._ops.OpOverload):
            return SIZE_FLOAT  # on the way to a size (`math.ceil(math.sqrt(n))`), whose own expression is read
        if any(a is SIZE_FLOAT for a in tree_leaves((args, kwargs))):
            raise Unsupported(f"{node.target}: a float computed from sizes reaches a kernel")
        rule = None if node.name in self.through_aten or node.name in self.host_work else LOWERINGS.get(node.target)
        if rule is not None and not reads_size_scalars(node.target, args, kwargs):
            rule = None  # ATen takes the float as the Python float eager's program passes it
        if rule is not None:
            try:
                as_eager, rule_args, rule_kwargs = eager_reads(node.target, rule, meta, args, kwargs,
                                                               host_scalar_operands(node.args))
                out = as_eager(self, meta, *rule_args, **rule_kwargs)
                return self._maybe_realize(node, out)
            except Unsupported as e:
                log.debug("%s: no lowering (%s), running it as an extern", node.target, e)
        return self.extern(node.target, args, kwargs, meta)

    def _on_host(self) -> bool:
        """Is the node being lowered one that runs on the CPU in a GPU graph: no GPU layout choice applies."""
        return self._current is not None and self._current.name in self.host_work

    def _read(self, arg: torch.fx.Node, env, reader: torch.fx.Node):
        """`arg`'s value as `reader` reads it: a 0-d value computed on the CPU, read by a node a kernel computes
        on a GPU, copied there once (kiln/lower/host_work.py; an ATen call takes the CPU scalar as eager's does);
        any other as it is."""
        kernel = reader.name not in self.host_work and reader.name not in self.through_aten \
            and reader.target in LOWERINGS
        device = crosses_to(arg, reader.meta.get("val"), self.host_work) if kernel else None
        if device is None:
            return env[arg]
        if arg not in self._crossed:
            self._crossed[arg] = self.extern(aten._to_copy.default, (env[arg],),
                                             {"device": device, "non_blocking": True}, arg.meta["val"])
        return self._crossed[arg]

    def _sym(self, meta):
        expr = sympify(meta)
        if not expr.free_symbols <= self.precomputed.bound(self.size_vars):
            raise Unsupported(f"size expression {expr} is not bound by the inputs")
        return expr

    def _maybe_realize(self, node, out):
        if not isinstance(out, IndexFunction):
            return out
        users = len(node.users)
        conv_stride = self.preferred_stride(node, out)
        if ir.expr_size(out.body) > MAX_INLINE_SIZE or (
                users > 1 and not out.is_trivial() and not self._recomputable(node, out)):
            if self._pads(out) and _feeds_matmul(node):
                return self.realize_zero_padded(out)
            return self.realize(out, stride=conv_stride)
        if users > 1 and out.buffer_view() is None and _realizing_uses(node) > 1:
            # each extern or output use would store its own copy (a bf16 weight cast read by a matmul and
            # saved for the backward): store it once, with eager's strides
            meta = node.meta.get("val")
            eager = _layout(meta).stride if isinstance(meta, torch.Tensor) else None
            return self.realize(out, stride=conv_stride or eager)
        returned = self._returned.get(node)
        if returned is not None and out.buffer_view() is None and ir.loads(out.body):
            # A value the graph returns is stored where it is computed, as Inductor's lowering does, not where the
            # output is reached: stored at the end, it would keep what it reads alive to the end (a gradient's
            # cast to float32 would hold the bf16 matmul result it casts through the rest of the backward). A
            # value that reads no buffer (a constant fill) costs nothing to hold back.
            meta = node.meta.get("val")
            eager = _layout(meta).stride
            return self.realize(out, stride=eager if returned == "visible" else conv_stride or eager)
        return out

    def preferred_stride(self, node: torch.fx.Node, out: IndexFunction) -> tuple | None:
        """Channels-last strides for `node`'s 4-d value `out` in a graph whose convolutions run channels-last,
        where the value is on a path through convolutions (`channels_last_values`): a value convolutions
        read is stored in the layout they run in (a residual stream read by the next block's convolution
        and by its residual add), not stored by rows and then copied per convolution, and the batch-norm
        and activation values between convolutions (forward and backward) are read and written in it."""
        if node not in self.channels_last_values or out.ndim != 4 or not _static(out.size):
            return None
        return channels_last_strides(out.size)

    def _in_eager_order(self, args: tuple, kwargs: dict, draws: bool = False) -> tuple[tuple, dict]:
        """The extern's computed operands stored in the dense order eager gives them (channels-last after a
        permute, a transposed projection): cuDNN and ATen pick their kernels by layout, and a depthwise
        convolution on a row-major copy of a channels-last value runs a generic kernel many times slower
        than the one eager runs. Values eager holds in row-major order (or not densely) stay row-major.

        An operand eager passes expanded (stride 0 on a broadcast dim: attention's mask, made per batch
        and expanded over the heads) is stored once and passed expanded the same way, not written out in
        full for every head (`realize_broadcast`).

        An op that `draws` random numbers gets each operand with eager's strides, stored already or not: ATen
        draws one number per element in the memory order of the tensor it draws into (`empty_like` of the
        operand), and on CUDA picks its kernel, and so the generator offsets of each element, by the operand's
        strides (contiguous or not): an operand kiln stored otherwise (a transposed value kept row-major, a
        strided slice copied dense) gets other numbers."""
        fx_args = self._current.args if self._current is not None else ()
        fx_kwargs = self._current.kwargs if self._current is not None else {}
        ordered = self._drawn_in_eager_order if draws else self._eager_ordered
        out = tuple(ordered(value, fx) for value, fx in zip(args, fx_args)) + args[len(fx_args):]
        return out, {k: ordered(value, fx_kwargs.get(k)) for k, value in kwargs.items()}

    def _drawn_in_eager_order(self, value, fx):
        """An operand of a random op: `value` with `fx`'s strides in eager (an expanded one as `_eager_ordered`
        passes it: no storage holds it with stride 0 but its own)."""
        meta = fx.meta.get("val") if isinstance(fx, torch.fx.Node) else None
        view = value.buffer_view() if isinstance(value, IndexFunction) else None
        if view is None or not isinstance(meta, torch.Tensor) or tuple(value.size) != tuple(meta.shape):
            return self._eager_ordered(value, fx)
        eager = _layout(meta)
        if not _layout_differs(view[2], meta) or any(n != 1 and s == 0 for n, s in zip(eager.size, eager.stride)):
            return value
        return self.realize(value, stride=eager.stride)

    def _eager_ordered(self, value, fx):
        """One operand of `_in_eager_order`: `value`, stored as eager holds `fx`'s value where that matters."""
        meta = fx.meta.get("val") if isinstance(fx, torch.fx.Node) else None
        computed = isinstance(value, IndexFunction) and value.buffer_view() is None
        if not (computed and isinstance(meta, torch.Tensor)):
            return value
        eager = _layout(meta)
        if eager.size != tuple(value.size):
            return value
        broadcast = _broadcast_dims(eager, value)
        if broadcast:
            return self.realize_broadcast(value, broadcast, eager.stride)
        if _memory_order(eager) is not None or _padded_rows(eager):
            return self.realize(value, stride=eager.stride)
        return value

    def realize_broadcast(self, v: IndexFunction, dims: list[int], eager_stride: tuple) -> IndexFunction:
        """`v`, whose values do not change along `dims`, stored with those dims of size 1 and returned as a
        view of that buffer expanded over them (stride 0). The other dims keep eager's strides, padded rows
        included: memory-efficient attention requires its mask's rows aligned, and eager pads them so."""
        small = IndexFunction(tuple(1 if d in dims else n for d, n in enumerate(v.size)), v.dtype, v.body)
        small = self.realize(small, stride=tuple(1 if d in dims else s for d, s in enumerate(eager_stride)))
        buf, offset, strides = small.buffer_view()
        stride = tuple(sympy.Integer(0) if d in dims else s for d, s in enumerate(strides))
        return from_buffer(buf, ir.Layout(tuple(v.size), stride, v.dtype, offset))

    def _recomputable(self, node, out: IndexFunction) -> bool:
        """Whether each user may recompute `out`: a few ops, every user lowered (an extern realizes its
        arguments, once per use), and the users' loads (users x loads) no more than realizing costs
        (loads, one store, one load per user), unless every load is a broadcast (a full-size buffer
        always costs more than re-reading values each row or column shares)."""
        body = out.body
        size = ir.expr_size(body)
        broadcast_only = size <= BROADCAST_RECOMPUTE_SIZE and _reads_no_full_tensor(out)
        if size > RECOMPUTE_SIZE and not broadcast_only:
            return False
        n_loads, users = len(ir.loads(body)), len(node.users)
        if users * n_loads > n_loads + 1 + users and not broadcast_only:
            return False
        return all(u.op == "call_function" and u.target in LOWERINGS for u in node.users)

    def extern(self, op, args, kwargs, meta) -> Any:
        """Run `op` through ATen on realized inputs; its outputs are buffers with eager's layout (with
        `channels_last_convs`, a convolution's and its backward's are channels-last, as their operands)."""
        any_order = op in ANY_ORDER_EXTERNS
        layout = layouts = None
        gpu_layouts = self.channels_last_convs and not self._on_host()
        if gpu_layouts and op is aten.convolution.default and _is_conv2d(args, meta):
            args = (self._channels_last(args[0]), self._channels_last(args[1])) + tuple(args[2:])
            layout = _channels_last_layout(meta)
        elif gpu_layouts and op is aten.convolution_backward.default and _is_conv2d_backward(args):
            # cuDNN's channels-last kernels, given channels-last operands, return channels-last gradients
            args = tuple(self._channels_last(a) for a in args[:3]) + tuple(args[3:])
            layouts = tuple(_channels_last_layout(m) if isinstance(m, torch.Tensor) and m.dim() == 4
                            else _layout(m) if isinstance(m, torch.Tensor) else None for m in meta)
        elif not any_order:
            args, kwargs = self._in_eager_order(args, kwargs, draws=torch.Tag.nondeterministic_seeded in op.tags)

        def convert(a):
            if isinstance(a, SizeScalar):  # the Python float eager's program passes, not a 0-d float64 tensor
                return ir.SizeFloatRef(wrapper_float(a))
            if isinstance(a, IndexFunction):
                return self.ref(a, any_order)
            if isinstance(a, sympy.Basic):
                return ir.SymRef(a)
            return a

        self._extern_args = True
        try:
            c_args = tree_map(convert, args)
            c_kwargs = tree_map(convert, kwargs)
        finally:
            self._extern_args = False
        schema = getattr(op, "_schema", None)
        aliases = bool(schema and any(r.alias_info is not None for r in schema.returns))
        name = self.new_name()
        if isinstance(meta, torch.Tensor):
            layout = layout or self._padded_result(op, c_args, name) or _layout(meta)
            self.add_buffer(ir.Extern(name, op, c_args, c_kwargs, layout, aliases))
            return from_buffer(name, layout)
        if isinstance(meta, (tuple, list)) and all(m is None or isinstance(m, (torch.Tensor, int, torch.SymInt))
                                                   for m in meta):
            # Ints among the results (fused attention's max sequence lengths) are known from the
            # fake result, as numbers or as expressions over the sizes: consumers get the value.
            layouts = layouts or tuple(_layout(m) if isinstance(m, torch.Tensor) else None for m in meta)
            self.add_buffer(ir.Extern(name, op, c_args, c_kwargs, layouts, aliases))
            outs = []
            for k, lay in enumerate(layouts):
                if lay is None:
                    outs.append(self._sym(meta[k]) if isinstance(meta[k], torch.SymInt)
                                else meta[k] if isinstance(meta[k], int) else None)
                    continue
                sub = self.new_name()
                self.add_buffer(ir.MultiOutput(sub, name, k, lay))
                outs.append(from_buffer(sub, lay))
            return type(meta)(outs) if isinstance(meta, tuple) else outs
        if meta is None:  # an op run for its check alone (`_linalg_check_errors` raises on a failed factorization)
            self.add_buffer(ir.Extern(name, op, c_args, c_kwargs, None, aliases))
            return None
        raise Unsupported(f"{op}: result of type {type(meta).__name__} cannot be an extern")

    def _padded_result(self, op, args: tuple, name: str) -> ir.Layout | None:
        """The layout of a matmul that shape padding will run padded (kiln/lower/shape_padding.py, as the
        Triton target's `prepare` decides): its result is the padded product's slice, rows `N` padded apart,
        and `name` joins `padded_results`; None for any other extern."""
        refs = [a for a in args if isinstance(a, ir.TensorRef)]
        if not self.pad_matmul_operands or op not in MATMUL_OPS or len(refs) < 2 or self._on_host():
            return None
        sizes = [*refs[-2].layout.size[-2:], refs[-1].layout.size[-1]]
        if not all(sympify(s).is_Integer for s in sizes):
            return None
        m, k, n = (int(s) for s in sizes)
        dtype = refs[-1].layout.dtype
        multiple = pads(m, k, n, dtype, "cuda")
        size = (*refs[-2].layout.size[:-1], refs[-1].layout.size[-1])
        strides = padded_result_strides(size, multiple) if multiple else None
        if strides is None:
            return None
        self.padded_results.add(name)
        return ir.Layout(tuple(sympify(s) for s in size), tuple(sympify(s) for s in strides), dtype)

    def _dense_channels_last(self, v: IndexFunction) -> bool:
        """Whether `v` is a whole buffer of this graph's, stored channels-last (a convolution's result, a
        value stored in its layout)."""
        view = v.buffer_view()
        if view is None or v.ndim != 4 or not _static(v.size) or view[0] in self.zero_padded or view[1] != 0:
            return False
        layout = self.layouts.get(view[0])  # the storage: in memory order where realized permuted
        return (layout is not None and sympy.prod(layout.size) == sympy.prod(v.size)
                and all(n == 1 or a == b for n, a, b in zip(v.size, view[2], channels_last_strides(v.size))))

    def _channels_last(self, v: IndexFunction) -> IndexFunction:
        """`v` (4-d) with channels-last strides: as it is if it has them, else stored so (a computed value
        written in that order, a weight copied)."""
        stride = channels_last_strides(v.size)
        view = v.buffer_view()
        if view is not None and all(n == 1 or a == b for n, a, b in zip(v.size, view[2], stride)):
            return v
        return self.realize(v, stride=stride)

    def _outputs(self, node: torch.fx.Node, owners: dict) -> list:
        """The graph's results (the args of output `node`), each realized as `_output` says. A buffer realized
        for one result holds what that result's FX node computes, not every value the graph returns: it is
        lowered as that node (`_current`) where it is one. Results past the visible outputs are values saved
        for the backward (`saved`)."""
        env = self._env
        values = tree_flatten(tree_map(lambda n: env[n] if isinstance(n, torch.fx.Node) else n, node.args[0]))[0]
        metas = tree_flatten(tree_map(lambda n: n.meta.get("val") if isinstance(n, torch.fx.Node) else n,
                                      node.args[0]))[0]
        if any(v is SIZE_FLOAT for v in values):
            raise Unsupported("the graph returns a float computed from sizes")
        results = tree_flatten(node.args[0])[0]
        aot = self.gm.meta.get("kiln.aot", {})
        visible, bases = aot.get("visible_outputs", len(results)), aot.get("alias_bases", ())
        outputs = []
        for k, (v, meta, result) in enumerate(zip(values, metas, results)):
            computed = isinstance(result, torch.fx.Node) and result.op == "call_function"
            self._current = result if computed else node
            outputs.append(self._output(v, meta, owners, _alias_root(result), result if k >= visible else None,
                                        k in bases))
        self._current = node
        return outputs

    def _output(self, v, meta, owners: dict, root, saved: torch.fx.Node | None = None, alias_base: bool = False):
        """The graph output `v` (traced value `meta`, a view of node `root` or `root` itself).

        `owners`: buffer -> the node whose storage it holds, so that an output with storage of its own
        in the traced graph (`x.clone()`, lowered as `x`) is not returned as an input's or another
        output's buffer: eager's are distinct tensors, and a write to one would show in the other.
        `saved`: the FX node of an output the forward saves for the backward alone (no caller sees it): it
        keeps a channels-last layout of kiln's own, which the backward is compiled for (kiln/autograd/aot.py
        hands it the strides the compiled forward returns). `alias_base`: other outputs are rebuilt on it as
        views at its traced geometry, so it keeps eager's strides (not a padded matmul's rows)."""
        if isinstance(v, IndexFunction):
            view = v.buffer_view()
            memory = None if view is None else self.memory_of.get(view[0], view[0])
            if view is not None and root is not None and owners.setdefault(memory, root) is not root:
                v = self.realize(v, stride=_layout(meta).stride)
                owners[v.buffer_view()[0]] = root
            elif view is not None and (view[0] in self.zero_padded or _layout_differs(view[2], meta)) \
                    and not (saved is not None and self._dense_channels_last(v)) \
                    and (alias_base or view[0] not in self.padded_results):
                # eager's strides, not kiln's own (padded rows, a channels-last convolution's result):
                # the caller may .view() it. A padded matmul's result is returned with its padded rows, as
                # torch.compile returns it (kiln/lower/shape_padding.py)
                v = self.realize(v, stride=_layout(meta).stride)
            elif view is None:
                preferred = self.preferred_stride(saved, v) if saved is not None else None
                v = self.realize(v, stride=preferred or (_layout(meta).stride if isinstance(meta, torch.Tensor)
                                                         else None))
            return self.ref(v)
        if isinstance(v, sympy.Basic):
            return ir.SymRef(v)
        return v


def _input_owners(placeholders: list, example_inputs: list, inputs: list) -> dict:
    """Input buffer name -> its placeholder (tensor placeholders, in order, as `run` binds them)."""
    tensors = [n for n, example in zip(placeholders, example_inputs)
               if isinstance(n.meta.get("val", example), torch.Tensor)]
    return {buf.name: n for buf, n in zip(inputs, tensors)}


def _alias_root(node):
    """The node whose storage `node`'s value is on: through view ops (their schema's result aliases
    their first argument) to a placeholder or a value computed with storage of its own."""
    while (isinstance(node, torch.fx.Node) and node.op == "call_function"
           and isinstance(node.target, torch._ops.OpOverload)
           and node.target._schema.returns and node.target._schema.returns[0].alias_info is not None
           and not node.target._schema.returns[0].alias_info.is_write and isinstance(node.args[0], torch.fx.Node)):
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) else None


def channels_last_strides(size) -> tuple:
    """The strides of a 4-d [N, C, H, W] tensor stored N, H, W, C (torch.channels_last)."""
    n, c, h, w = (sympify(s) for s in size)
    return (h * w * c, sympy.Integer(1), w * c, c)


def _channels_last_layout(meta: torch.Tensor) -> ir.Layout:
    return ir.Layout(tuple(sympify(s) for s in meta.shape), channels_last_strides(meta.shape), meta.dtype)


def _is_conv2d_backward(args) -> bool:
    """The backward of a plain 2-d convolution (not transposed) of 4-d static-size tensors."""
    grad_output, x, weight, transposed = args[0], args[1], args[2], args[7]
    return (all(isinstance(a, IndexFunction) and a.ndim == 4 and _static(a.size) for a in (grad_output, x, weight))
            and not transposed)


def _is_conv2d(args, meta) -> bool:
    """A plain 2-d convolution (not transposed) of 4-d static-size tensors."""
    x, weight, transposed = args[0], args[1], args[6]
    return (isinstance(meta, torch.Tensor) and meta.dim() == 4 and isinstance(x, IndexFunction)
            and isinstance(weight, IndexFunction) and weight.ndim == 4 and not transposed
            and all(sympify(s).is_Integer for s in tuple(meta.shape) + tuple(x.size)))


def _feeds_matmul(node: torch.fx.Node) -> bool:
    """Whether a matmul reads `node`, directly or through views."""
    return any(u.op == "call_function" and (u.target in MATMUL_OPS or u.target in VIEW_OPS and _feeds_matmul(u))
               for u in node.users)


def _layout_differs(strides, meta) -> bool:
    """Whether a buffer view's strides differ from eager's (`meta`'s) on a dim of more than one element."""
    if not isinstance(meta, torch.Tensor):
        return False
    eager = _layout(meta)
    return any(n != 1 and sympify(a) != b for n, a, b in zip(eager.size, strides, eager.stride))


def _broadcast_dims(eager: ir.Layout, v: IndexFunction) -> list[int]:
    """The dims (of more than one element) along which eager's operand is expanded (stride 0) and `v`'s body
    does not vary: storing `v` once along them loses nothing."""
    variables = index_vars("i", v.ndim)
    used = ir.index_symbols(v.body)
    return [d for d, (n, s) in enumerate(zip(eager.size, eager.stride))
            if n != 1 and sympify(s) == 0 and variables[d] not in used]


def _padded_rows(layout: ir.Layout) -> bool:
    """Whether `layout` is row-major with gaps after some dims' runs (rows padded to an alignment, as eager pads
    an attention mask for the memory-efficient kernel), not dense: static strides, the last one 1, each
    dim's stride at least the extent of the dims inside it."""
    dims = [d for d, n in enumerate(layout.size) if n != 1]
    if not dims or not all(sympify(s).is_Integer for s in layout.stride) or not _static(layout.size):
        return False
    stride, size = [int(layout.stride[d]) for d in dims], [int(layout.size[d]) for d in dims]
    if stride[-1] != 1:
        return False
    inside = [stride[k + 1] * size[k + 1] for k in range(len(dims) - 1)]
    return all(s >= e for s, e in zip(stride, inside)) and any(s > e for s, e in zip(stride, inside))


def _static(size) -> bool:
    return all(sympify(s).is_Integer for s in size)


def _returned_nodes(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    """The FX nodes the graph returns (as themselves, not through a view): "visible" where the caller sees one,
    "saved" for a value a forward returns only to save it for its backward."""
    outputs = gm.graph.find_nodes(op="output")
    if not outputs:
        return {}
    results = tree_flatten(outputs[0].args[0])[0]
    visible = gm.meta.get("kiln.aot", {}).get("visible_outputs", len(results)) if isinstance(gm.meta, dict) \
        else len(results)
    returned: dict[torch.fx.Node, str] = {}
    for k, result in enumerate(results):
        if isinstance(result, torch.fx.Node) and isinstance(result.meta.get("val"), torch.Tensor):
            if k < visible or returned.get(result) != "visible":
                returned[result] = "visible" if k < visible else "saved"
    return returned


def _realizing_uses(node: torch.fx.Node) -> int:
    """How many uses of `node` (looking through views) store it in a buffer of their own: externs and the
    graph's output."""
    count = 0
    for user in node.users:
        if user.op == "call_function" and user.target in VIEW_OPS:
            count += _realizing_uses(user)
        elif user.op != "call_function" or user.target not in LOWERINGS:  # the output, or an extern
            count += 1
    return count


def merged_copy_dims(sizes: list, body) -> tuple[list, Any]:
    """A copy into a dense buffer (`body` one unmasked affine load over `sizes`' loop variables) with each
    pair of neighbouring dims that the load also walks as one run merged into one dim.

    A 3x3 convolution weight copied channels-last is [O, KH, KW, I] read at o*9*I + i*9 + kh*3 + kw: as
    [O, 9, I] its 9 taps are one dim the loads walk contiguously, which a tiled kernel can read whole
    (as four dims, no dim of the copy reads more than 3 neighbouring elements)."""
    if not isinstance(body, ir.Load) or body.mask is not None or body.indirect \
            or not all(sympify(n).is_Integer for n in sizes):
        return sizes, body
    variables = index_vars("i", len(sizes))
    affine = affine_strides(body.index, variables)
    if affine is None:
        return sizes, body
    offset, strides = affine[0], list(affine[1])
    sizes = [sympify(n) for n in sizes]
    for k in reversed(range(len(sizes) - 1)):
        if strides[k] == sizes[k + 1] * strides[k + 1]:
            sizes[k:k + 2] = [sizes[k] * sizes[k + 1]]
            del strides[k]
    if len(sizes) == len(variables):
        return sizes, body
    merged = index_vars("i", len(sizes))
    index = offset + sum((st * var for st, var in zip(strides, merged)), sympy.Integer(0))
    return sizes, ir.Load(body.buf, index, body.dtype)



def _without_unread_items(nodes: list[ir.Node], outputs: list) -> list[ir.Node]:
    """`nodes` less the items of extern tuple results that no node reads and the graph does not return.

    Such an item is not even taken out of the result at run time: a fused attention's fake result has a
    tensor where the op may return None (cuDNN attention's logsumexp when none is asked for, at inference),
    and binding it (reading its strides) raised on the GPU."""
    read = {o.buf for o in outputs if isinstance(o, ir.TensorRef)}
    for n in nodes:
        read |= {ld.buf for ld in ir.loads(n.data.body)} if isinstance(n, ir.ComputedBuffer) else ir.extern_reads(n)
    return [n for n in nodes if not isinstance(n, ir.MultiOutput) or n.name in read]


def _memory_order(layout: ir.Layout):
    """The dims of `layout` outermost-first in memory when it is a dense layout in another order than the
    logical one (size-1 dims placed where they stand), else None."""
    if not all(sympy.sympify(s).is_Integer for s in layout.stride):
        return None
    dims = [d for d, n in enumerate(layout.size) if n != 1]
    order = sorted(dims, key=lambda d: -int(layout.stride[d]))
    dense = dense_strides(layout.size, order)
    if order == dims or any(sympy.sympify(layout.stride[d]) != dense[d] for d in order):
        return None  # the logical order, or not dense (padded or overlapping)
    units = [d for d in range(len(layout.size)) if d not in dims]
    return units + order  # size-1 dims first: they do not move any address


def _reads_no_full_tensor(v: IndexFunction) -> bool:
    """Whether each load of `v` is indexed by fewer than all of `v`'s non-trivial dims (a broadcast)."""
    dims = {var for var, n in zip(index_vars("i", v.ndim), v.size) if n != 1}
    return all(not dims <= sympy.sympify(ld.index).free_symbols for ld in ir.loads(v.body))


def _layout(t: torch.Tensor) -> ir.Layout:
    # offset 0: kernels address a tensor from its data_ptr, which includes the storage offset
    return ir.Layout(tuple(sympify(s) for s in t.shape), tuple(sympify(s) for s in t.stride()), t.dtype)


def lower_graph(gm: torch.fx.GraphModule, example_inputs, pad_matmul_operands: bool = False,
                channels_last_convs: bool = False, through_aten: frozenset = frozenset()) -> ir.LoweredGraph:
    """Lower `gm` (ATen-level, with `meta["val"]` on its nodes) to the loop-level IR.

    GPU choices: `pad_matmul_operands` (shape padding) stores computed matmul operands with long unaligned
    rows with zero-padded rows; `channels_last_convs` runs 2-d convolutions on channels-last tensors
    (cuDNN's native layout: NCHW convolutions transpose their input and output inside cuDNN), and the
    kernels between them read and write that layout. `through_aten` names FX nodes to run as ATen
    externs whatever their lowering (kiln.fallbacks: the ops of a kernel that failed to build)."""
    return GraphLowering(gm, pad_matmul_operands, channels_last_convs, through_aten).run(example_inputs)

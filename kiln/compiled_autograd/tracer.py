"""kiln's autograd compiler: what the engine calls, node by node, to turn the backward it is about to run
into one FX graph.

On a cache miss the engine (see `engine.py`) makes one `AutogradGraphTracer` and walks the autograd graph
in execution order on fake values, calling:

- `begin_capture` with everything the graph reads: tensors (saved tensors, incoming grads, parameters),
  sizes it saw change (symbolic from then on), lifted scalars. Each becomes an entry of a placeholder list
  (`inputs`, `sizes`, `scalars`, `hooks`, `packed_data`) and a fake value bound to that entry;
- for each built-in node, `bind_function` once and `apply_functional` per call: the node's backward
  formula as a C++ function of (grads, saved values). kiln runs it right here on the fake values under a
  dispatch-level tracer, so the graph holds the ATen ops themselves, not an opaque call;
- `validate_outputs` (dtype/shape fix-ups of the grads flowing to the next node), likewise traced through;
- `proxy_call_backward` for a Python `autograd.Function`, `tensor_pre_hook` / `pre_hook` / `post_hook` /
  `post_acc_grad_hook` for hooks, `accumulate_grad` for leaves: these become call nodes that run the
  user's Python (`kiln.compiled_autograd.ops`), because their code is not the engine's to trace;
- `end_capture` with the graph's outputs (the grads `torch.autograd.grad` returns).

The graph is then compiled by the user's `compiler_fn`; the engine keeps it in its cache, keyed by the
structure of the autograd graph (node types, their non-tensor attributes, hooks present, static sizes).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import (
    ProxyTorchDispatchMode,
    PythonKeyTracer,
    disable_autocast_cache,
    disable_proxy_modes_tracing,
    track_tensor_tree,
)
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from kiln.compiled_autograd import engine, ops
from kiln.effects import has_effect

log = logging.getLogger("kiln.compiled_autograd")
verbose_log = logging.getLogger("kiln.compiled_autograd_verbose")

PLACEHOLDERS = ("inputs", "sizes", "scalars", "hooks", "packed_data")
_graph_ids = itertools.count()
# Calls that act on Python state or tensors outside the graph's values: dead-code elimination keeps them.
_IMPURE = {ops.call_hook, ops.call_backward, ops.call_opaque}


class AutogradGraphTracer:
    """One capture: builds the FX graph while the engine replays the backward on fake values."""

    def __init__(self, compiler_fn: Callable[[fx.GraphModule], Callable]) -> None:
        self.compiler_fn = compiler_fn
        self.stack = contextlib.ExitStack()
        self.shape_env = ShapeEnv()
        self.fake_mode = FakeTensorMode(allow_fallback_kernels=True, allow_non_fake_inputs=True,
                                        shape_env=self.shape_env)
        self.fx_tracer = PythonKeyTracer()
        self.proxy_mode = ProxyTorchDispatchMode(self.fx_tracer, "symbolic")
        self.placeholders: dict[str, fx.Proxy] = {}
        self.symbol_proxies: dict[Any, fx.Proxy] = {}  # SymNode of a lifted size/scalar -> its graph value
        self.node_origin = ""
        self.assigned_grads: list[tuple[int, torch.Tensor, str]] = []  # leaf input index, new grad, how
        # hooks the run wrapper calls after the graph: (kind, hook index, input index, after_values index)
        self.after_graph: list[tuple[str, int, int | None, int | None]] = []
        self.after_values: list[torch.Tensor] = []  # graph values those hooks receive
        self.version_checks: list[tuple[int, tuple]] = []  # (hook index of a kiln ctx, tangents present)

    def close(self) -> None:
        """The engine calls this when the capture ends, normally or by an exception."""
        self.stack.close()

    # --- begin ----------------------------------------------------------------------------------------
    def begin_capture(self, inputs: list, sizes: Sequence[int], scalars: list, origins: Any = None, *flags):
        """Placeholders for everything the graph reads; returns the fake/symbolic values the engine traces
        with in their place."""
        self.graph_id = next(_graph_ids)
        self.fx_tracer.root = torch.nn.Module()
        self.fx_tracer.graph = fx.Graph(tracer_cls=PythonKeyTracer)
        self.fx_tracer.tensor_attrs = {}
        for name in PLACEHOLDERS:
            self.placeholders[name] = self.fx_tracer.create_proxy("placeholder", name, (), {})
        fakes = [self.fake_mode.from_tensor(x) for x in inputs]
        self.input_index = {id(f): i for i, f in enumerate(fakes)}
        self._bind(fakes, [self.placeholders["inputs"][i] for i in range(len(fakes))])
        sym_sizes = [self._symbol("sizes", i, v) for i, v in enumerate(sizes)]
        sym_scalars = [self._symbol("scalars", i, v) for i, v in enumerate(scalars)]
        self.stack.enter_context(self.fake_mode)
        self.stack.enter_context(self.proxy_mode)
        self.stack.enter_context(disable_autocast_cache())
        self.stack.enter_context(_suppress_guards(self.shape_env))
        return engine.begin_capture_result(f"kiln_ca{self.graph_id}", fakes, sym_sizes, sym_scalars)

    def _symbol(self, placeholder: str, index: int, value: int | float):
        """A symbolic int/float standing for entry `index` of a size/scalar placeholder.

        Sizes the engine lifts are the ones it saw change between calls: they stay symbolic so the one
        graph serves every value, as the engine's cache will call it with each of them.
        """
        source = engine.GraphInputSource(placeholder, index)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"compiled autograd: unexpected {placeholder} entry {value!r}")
        if isinstance(value, int):
            sym = self.shape_env.create_unspecified_symint_and_symbol(value, source, DimDynamic.DYNAMIC)
        else:
            expr = self.shape_env.create_unspecified_symbol(value, source=source, dynamic_dim=DimDynamic.DYNAMIC)
            sym = self.shape_env.create_symfloatnode(expr, hint=value, source=source)
        proxy = self.placeholders[placeholder][index]
        if placeholder == "sizes":  # carried as a tensor's dimension: see `ops.size_carrier`
            proxy = self.fx_tracer.create_proxy("call_function", ops.carried_size, (proxy,), {})
        if isinstance(sym, (torch.SymInt, torch.SymFloat)):
            self.symbol_proxies[sym.node] = proxy
            self._bind([sym], [proxy])  # the dispatch-level tracer records ops on it in terms of `proxy`
        return sym

    # --- built-in nodes: traced through -----------------------------------------------------------------
    def bind_function(self, fn_name: str, fn: Callable, is_custom_function: bool = False,
                      is_traceable: bool = True) -> str:
        """The engine hands each node type's functional backward once per process; kept by name."""
        return ops.FUNCTIONS.bind(fn_name, fn, is_custom_function, is_traceable)

    def apply_functional(self, fn_name: str, grads: Sequence, args: Any, output_metadata: Sequence) -> list:
        """A node's backward formula. A traceable one runs here on the fake values, so its ATen ops land in
        the graph; one that is not (a custom C++ function) becomes an opaque call."""
        fn = ops.FUNCTIONS.get(fn_name)
        if ops.FUNCTIONS.traceable(fn_name):
            return list(fn(grads, *args))
        return self._opaque(fn_name, (grads, *args), output_metadata)

    def validate_outputs(self, _fn_name: Any, outputs: list, args: Any, output_metadata: Sequence) -> list:
        """Shape/dtype fix-ups of the grads passed on (sum to the input's size, cast): traced through."""
        return list(ops.FUNCTIONS.get("validate_outputs")(outputs, *args))

    def proxy_call(self, fn: Callable, args: Any, output_metadata: Sequence) -> list:
        return self._call_node(fn, args, len(output_metadata))

    def call_copy_slices_prologue(self, inputs, *view_args) -> list:
        return list(ops.copy_slices_prologue(inputs, *view_args))

    def call_copy_slices_epilogue(self, needs_input_grad, result, res, grad_slice) -> list:
        return list(ops.copy_slices_epilogue(needs_input_grad, result, res, grad_slice))

    def allocate_dummy(self) -> torch.Tensor:
        with disable_proxy_modes_tracing():
            return torch.zeros([0, 123456789])

    def allocate_dummy_like(self, x: torch.Tensor) -> torch.Tensor:
        with disable_proxy_modes_tracing():
            return torch.empty_like(x)

    def accumulate(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """Two grads flowing into one node input add up (the engine's InputBuffer)."""
        return torch.add(old, new)

    # --- user code: call nodes -------------------------------------------------------------------------
    def proxy_call_backward(self, inputs: Sequence, output_metadatas: Sequence, saved_tensors: Sequence,
                            backward_idx: int, ctx: Any = None, *_rest) -> tuple:
        """A Python autograd.Function's backward: a call node running the user's `backward` on the ctx. The
        backward of a kiln-compiled forward graph offers its ATen ops instead (`traced_backward`), which are
        traced into this graph."""
        traced = getattr(getattr(ctx, "_forward_cls", None), "traced_backward", None)
        if traced is not None:
            grads = traced(list(saved_tensors), tuple(inputs), self._inline)
            if grads is not None:
                if getattr(ctx, "versions", None) is not None:  # checked by the run wrapper, before the graph
                    present = tuple(inputs[i] is not None for i in ctx._forward_cls.tangent_outputs)
                    self.version_checks.append((backward_idx, present))
                return grads
        fn_ctx = self.placeholders["hooks"][backward_idx]
        proxy = self.fx_tracer.create_proxy("call_function", ops.call_backward,
                                            (fn_ctx, self.to_proxy(list(saved_tensors)), *self.to_proxy(list(inputs))),
                                            {})
        with disable_proxy_modes_tracing():
            grads = [None if meta is None else torch.empty(size=meta[3], dtype=meta[2], layout=meta[0],
                                                            device=meta[1]) for meta in output_metadatas]
            grads = [self.fake_mode.from_tensor(g) if g is not None else None for g in grads]
        self._bind_present(grads, proxy)
        return tuple(grads)

    def tensor_pre_hook(self, inputs: list, hook_id: int, i: int) -> list:
        """`t.register_hook(fn)`: fn(grad) replaces the grad (None keeps it)."""
        inputs[i] = self._hook(hook_id, "tensor_pre_hook", inputs[i])
        return inputs

    def cpp_tensor_pre_hook(self, inputs: list, hook_id: int, i: int) -> list:
        """A hook registered from C++: `retain_grad()`, which stores the grad on a non-leaf and passes it on
        unchanged. It cannot run inside a graph (it writes `.grad`), so the grad leaves the graph and the
        run wrapper calls the hook on it afterwards."""
        self.after_graph.append(("cpp_tensor_pre_hook", hook_id, None, len(self.after_values)))
        self.after_values.append(inputs[i])
        return inputs

    def pre_hook(self, inputs: list, hook_id: int) -> list:
        """A node pre-hook (module full backward pre-hooks): fn(grad_outputs) may replace them."""
        proxy = self.fx_tracer.create_proxy("call_function", ops.call_hook,
                                            (self.placeholders["hooks"][hook_id], self.to_proxy(list(inputs))),
                                            {"hook_type": "pre_hook"})
        return [self._fresh_like(x, proxy[i]) if x is not None else None for i, x in enumerate(inputs)]

    def post_hook(self, outputs: list, inputs: list, hook_id: int) -> list:
        """A node post-hook (module full backward hooks): fn(grad_inputs, grad_outputs) may replace them."""
        proxy = self.fx_tracer.create_proxy("call_function", ops.call_hook,
                                            (self.placeholders["hooks"][hook_id], self.to_proxy(list(outputs)),
                                             self.to_proxy(list(inputs))), {"hook_type": "post_hook"})
        return [self._fresh_like(x, proxy[i]) if x is not None else None for i, x in enumerate(outputs)]

    def post_acc_grad_hook(self, input: torch.Tensor, hook_id: int) -> list:
        """`p.register_post_accumulate_grad_hook(fn)`: fn(p) runs once p.grad is updated, which for a new
        grad is after the graph: the run wrapper calls it then (in the engine's order among such hooks)."""
        self.after_graph.append(("post_acc_grad_hook", hook_id, self.input_index[id(input)], None))
        return [input]

    def unpack_hook(self, hook_id: int, data_id: int) -> torch.Tensor:
        """A saved-tensor unpack hook (torch.autograd.graph.saved_tensors_hooks) runs at backward time."""
        proxy = self.fx_tracer.create_proxy("call_function", ops.call_hook,
                                            (self.placeholders["hooks"][hook_id],
                                             self.placeholders["packed_data"][data_id]), {"hook_type": "unpack_hook"})
        out = self.allocate_dummy()
        self._bind([out], [proxy])
        return out

    def accumulate_grad(self, *args) -> torch.Tensor | None:
        """A leaf's AccumulateGrad. Where the leaf already has a grad (and no graph of the backward is
        being built) the sum is written into it in place inside the graph, as the eager engine does, so
        it fuses with the formula that computed it. A new grad leaves the graph as an output that the run
        wrapper assigns to `.grad` (a graph cannot set an attribute of its input)."""
        variable, variable_grad, grad, has_post_hooks = engine.accumulate_grad_args(args)
        index = self.input_index[id(variable)]
        if grad is None:
            return variable_grad if len(args) == 4 else None
        if variable_grad is not None and not torch.is_grad_enabled():
            variable_grad.add_(grad)
            result = variable_grad
        elif variable_grad is not None:
            result = variable_grad + grad
            self.assigned_grads.append((index, result, "assign"))
        else:
            result = grad
            self.assigned_grads.append((index, grad, "accumulate" if len(args) == 3 else "assign"))
        with disable_proxy_modes_tracing():
            variable.grad = self._fresh_like(result, self.to_proxy(result))
        return variable.grad if len(args) == 4 else None

    # --- bookkeeping ------------------------------------------------------------------------------------
    def set_node_origin(self, node_name: str, nodecall_index: int, pyobj: Any = None) -> None:
        """Which autograd node the ops traced next come from; kept on each FX node's meta."""
        self.node_origin = f"{node_name} (NodeCall {nodecall_index})"

    def log_compile_reasons(self, reasons: list[str]) -> None:
        """Why the engine's cache missed (it works this out only while a miss logger is installed)."""
        for reason in reasons:
            log.info("compiled autograd captures a graph: %s", reason)

    def bind_backward_state(self, index: int) -> Any:
        raise NotImplementedError("compiled autograd: BackwardState (hooks registered inside a compiled "
                                  "forward by torch.compile) is not supported by kiln")

    # --- end --------------------------------------------------------------------------------------------
    def end_capture(self, outputs: list) -> Any:
        """Close the graph, compile it with the user's compiler_fn, and hand the engine its runner."""
        self.stack.close()
        grads = [g for _, g, _ in self.assigned_grads]
        self.fx_tracer.create_node("output", "output",
                                   (self.fx_tracer.create_arg((self.to_proxy(list(outputs)), self.to_proxy(grads),
                                                               self.to_proxy(self.after_values))),),
                                   {})
        graph = self.fx_tracer.graph
        _strip_fake_meta(graph)
        graph.eliminate_dead_code(lambda n: has_effect(n) or _unpacks_input(n)
                                  or (n.op == "call_function" and n.target in _IMPURE))
        gm = fx.GraphModule(self.fx_tracer.root, graph, f"CompiledAutograd{self.graph_id}")
        if log.isEnabledFor(logging.INFO):  # printed only where it is logged: a large graph prints slowly
            log.info("compiled autograd graph %d:\n%s", self.graph_id, gm.print_readable(print_output=False))
        verbose_log.debug("compiled autograd graph %d (%d nodes, %d symbolic sizes)", self.graph_id,
                          len(graph.nodes), sum(1 for _ in self.symbol_proxies))
        compiled = self.compiler_fn(gm)
        ops.STATS.graphs.append(gm)
        plan = ops.RunPlan(tuple((i, how) for i, _, how in self.assigned_grads), tuple(self.after_graph),
                           tuple(self.version_checks))
        return engine.end_capture_result(functools.partial(ops.run_graph, plan), compiled)

    # --- helpers ----------------------------------------------------------------------------------------
    def to_proxy(self, value: Any) -> Any:
        """The graph value standing for `value` (a fake tensor, a symbolic size, or a constant)."""
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_proxy(v) for v in value)
        if isinstance(value, (torch.SymInt, torch.SymFloat)):
            if value.node in self.symbol_proxies:
                return self.symbol_proxies[value.node]
            return engine.proxy_of(self.fx_tracer, value).force()
        if isinstance(value, torch.Tensor):
            return engine.proxy_of(self.fx_tracer, value).proxy
        return value

    def _bind(self, values: Sequence, proxies: Sequence) -> None:
        track_tensor_tree(list(values), list(proxies), constant=None, tracer=self.fx_tracer)

    def _bind_present(self, values: Sequence, proxy: fx.Proxy) -> None:
        present = [(v, proxy[i]) for i, v in enumerate(values) if v is not None]
        self._bind([v for v, _ in present], [p for _, p in present])

    def _fresh_like(self, x: torch.Tensor | None, proxy: fx.Proxy) -> torch.Tensor | None:
        """A new fake value bound to `proxy`, with x's metadata: the engine requires hooks to keep shapes."""
        if x is None:
            return None
        with disable_proxy_modes_tracing():
            fresh = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
        self._bind([fresh], [proxy])
        return fresh

    def _hook(self, hook_id: int, hook_type: str, value: torch.Tensor) -> torch.Tensor:
        proxy = self.fx_tracer.create_proxy("call_function", ops.call_hook,
                                            (self.placeholders["hooks"][hook_id], self.to_proxy(value)),
                                            {"hook_type": hook_type})
        return self._fresh_like(value, proxy)

    def _inline(self, gm: fx.GraphModule, args: list) -> list:
        """`gm` (a kiln backward graph: ATen ops) run on `args`, as a copy of its nodes into this graph.

        Running it op by op under the fake and proxy modes would work out every intermediate value's
        metadata, the bulk of a capture's time; the graph's own recorded values give the outputs' metadata
        instead, valid where its inputs are what it was traced for (the same sizes, strides, dtypes and
        devices). A graph with something else (other inputs, constants, a value without metadata) runs
        through the interpreter."""
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        outputs = gm.graph.output_node().args[0]
        env = self._input_nodes(placeholders, args) if _inlinable(gm, placeholders, args, outputs) else None
        if env is None:
            return list(fx.Interpreter(gm).run(*args))
        values = dict(zip(placeholders, args))
        for node in gm.graph.nodes:
            if node.op == "call_function":
                env[node] = self.fx_tracer.graph.node_copy(node, env.__getitem__)
        results = []
        for out in outputs:
            if isinstance(out, fx.Node) and out not in values:
                values[out] = self._fresh_like(out.meta["val"], fx.Proxy(env[out], self.fx_tracer))
            results.append(values[out] if isinstance(out, fx.Node) else out)
        return results

    def _input_nodes(self, placeholders: list, args: list) -> dict | None:
        """Each placeholder -> the node of this graph holding its argument; None if one is not a value of
        this graph (a tensor the tracer does not track, which the interpreter would take as a constant)."""
        nodes = {}
        for placeholder, arg in zip(placeholders, args):
            proxy = getattr(engine.proxy_of(self.fx_tracer, arg), "proxy", None)
            if proxy is None:
                return None
            nodes[placeholder] = proxy.node
        return nodes

    def _call_node(self, fn: Callable, args: Any, n_outputs: int) -> list:
        proxy = self.fx_tracer.create_proxy("call_function", fn, pytree.tree_map(self.to_proxy, args), {})
        outs = [self.allocate_dummy() for _ in range(n_outputs)]
        self._bind(outs, [proxy[i] for i in range(n_outputs)])
        return outs

    def _opaque(self, fn_name: str, args: tuple, output_metadata: Sequence) -> list:
        proxy = self.fx_tracer.create_proxy("call_function", ops.call_opaque,
                                            (fn_name, *pytree.tree_map(self.to_proxy, args)), {})
        with disable_proxy_modes_tracing():
            outs = [None if meta is None else torch.empty(size=meta[3], dtype=meta[2], layout=meta[0],
                                                           device=meta[1]) for meta in output_metadata]
            outs = [self.fake_mode.from_tensor(o) if o is not None else None for o in outs]
        self._bind_present(outs, proxy)
        return outs


def _inlinable(gm: fx.GraphModule, placeholders: list, args: list, outputs: Any) -> bool:
    """Whether `gm` can be copied node by node onto `args` (see `AutogradGraphTracer._inline`): only ATen
    calls, every input a tensor with the metadata the graph recorded for it, every output a tensor it
    recorded (or an input, or None)."""
    if len(placeholders) != len(args) or not isinstance(outputs, (list, tuple)):
        return False
    if any(node.op not in ("placeholder", "call_function", "output") or
           (node.op == "call_function" and not _is_aten_call(node)) for node in gm.graph.nodes):
        return False
    for node, arg in zip(placeholders, args):
        if not isinstance(arg, torch.Tensor) or not _same_metadata(node.meta.get("val"), arg):
            return False
    return all(out is None or (isinstance(out, fx.Node) and isinstance(out.meta.get("val"), torch.Tensor)
                               and not out.meta["val"].requires_grad) for out in outputs)


def _is_aten_call(node: fx.Node) -> bool:
    """An ATen operator, or the `getitem` that takes one output of a multi-output operator (a Python function
    in the graph would run under kiln's capture of the captured graph instead of as the interpreter runs it)."""
    return isinstance(node.target, torch._ops.OpOverload) or node.target is operator.getitem


def _same_metadata(recorded: Any, value: torch.Tensor) -> bool:
    """Whether `value` (sizes symbolic in the capture, compared by the values they stand for now: comparing
    the symbols would record each comparison in the graph) has the metadata `recorded` (static). The stride
    of a dimension of size 1 steps nowhere: kernels differ on it (`unsqueeze` gives 1, an expand 0), layouts
    do not."""
    if not isinstance(recorded, torch.Tensor) or recorded.dtype != value.dtype or recorded.device != value.device:
        return False
    shape = tuple(recorded.shape)
    return shape == _concrete(value.shape) and _spanning(shape, recorded.stride()) == _spanning(
        shape, _concrete(value.stride()))


def _spanning(shape: tuple, strides: tuple) -> tuple:
    return tuple(stride for size, stride in zip(shape, strides) if size != 1)


def _concrete(sizes: Sequence) -> tuple[int, ...]:
    return tuple(s.node.hint if isinstance(s, torch.SymInt) else s for s in sizes)


def _unpacks_input(node: fx.Node) -> bool:
    """`inputs[i]` reads stay even when unused: the engine's calling convention lists every input."""
    return node.op == "call_function" and node.target is operator.getitem and node.args[0].op == "placeholder"


def _strip_fake_meta(graph: fx.Graph) -> None:
    """The trace ran on fake values (and dummies for opaque calls' outputs); a backend must not read them
    as the real metadata."""
    for node in graph.nodes:
        for key in ("val", "tensor_meta", "example_value"):
            node.meta.pop(key, None)


@contextlib.contextmanager
def _suppress_guards(shape_env: ShapeEnv):
    """Symbolic sizes stay symbolic: a formula comparing them must not specialize the graph."""
    with shape_env.suppress_guards():
        yield

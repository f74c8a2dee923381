"""The public entry points: `kiln.compile` and its companions, mirroring torch.compile's API."""
from __future__ import annotations

import functools
import textwrap
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kiln import compiled_autograd, fallbacks
from kiln.backends import resolve_backend, shares_by_value
from kiln.capture.entry import CompileContext, call_module, forward_replaced, has_hooks
from kiln.capture.hooked_call import call_module_with_hooks
from kiln.config import describe_options
from kiln.distributed import compiled_inner_module, split_at_ddp_buckets

_contexts: weakref.WeakSet[CompileContext] = weakref.WeakSet()


def compile(model: Callable | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend: str | Callable = "inductor", mode: str | None = None, options: dict | None = None,
            disable: bool = False):
    """Compile `model` (a function, bound method or nn.Module) just in time; a drop-in for torch.compile.

    Usable as `kiln.compile(fn)`, `@kiln.compile` and `@kiln.compile(backend="eager")`. Nothing is compiled
    here: each frame is captured on its first call, and again when a guard of every compiled entry fails.

    Args:
        model (Callable or nn.Module): the function, bound method or module to compile. A module is
            wrapped in an OptimizedModule that shares its parameters, buffers and state.
        fullgraph (bool): if False (default), kiln ends the graph at what it cannot capture (a graph
            break), runs that instruction in Python and captures the rest of the function as another
            graph. If True, the first graph break raises FullGraphError naming the reason and the line.
        dynamic (bool or None): sizes as symbols. True: every size is symbolic from the first compile.
            False: every size is specialized, and a new size recompiles. None (default): specialize at
            first, and when a size change causes a recompile, compile that dimension as a symbol. Sizes 0
            and 1 are always specialized; `kiln.mark_dynamic` and `kiln.mark_static` choose per dimension.
        backend (str or Callable): what a captured graph is handed to.
            - "inductor" (default): kiln's code generator (kiln/pipeline.py): the graph's forward and
              backward are traced to ATen, fused into C++/OpenMP kernels for CPU tensors and Triton
              kernels for CUDA tensors, and run by a generated wrapper.
            - "eager": the captured graph runs as it is (tells a capture bug from a code-generation bug).
            - "aot_eager": kiln's autograd stage only; the ATen graphs run op by op.
            - "cudagraphs": the ATen graphs run op by op, recorded into CUDA graphs and replayed.
            - a callable `backend(gm, example_inputs) -> callable`, torch.compile's contract: any
              torch.compile backend works. `kiln.register_backend` adds a name; `kiln.list_backends()`
              lists them.
        mode (str or None): a preset of options for the inductor backend (`kiln.list_mode_options()`).
            - "default" (or None): fused kernels, block sizes chosen by a heuristic; on CUDA, small matmuls
              become Triton templates with their epilogues fused.
            - "reduce-overhead": also records each compiled graph into CUDA graphs and replays it, which
              removes most launch overhead; outputs are valid until the next call, and CPU graphs run
              without CUDA graphs (one perf_hints line says why).
            - "max-autotune": also benchmarks the block sizes of each Triton kernel, and Triton matmul
              templates against ATen, on the first call's inputs (the choice cached on disk); with CUDA
              graphs. The C++ target has nothing to tune.
            - "max-autotune-no-cudagraphs": "max-autotune" without CUDA graphs.
        options (dict or None): options for the inductor backend, by name; they override what `mode`
            sets. Every option is listed below and by `kiln.list_options()`.
        disable (bool): if True, return `model` unchanged (compile nothing; for switching kiln off).

    Returns:
        An OptimizedModule for a module; otherwise a callable with `model`'s signature.

    Raises:
        TypeError or ValueError, at this call, for an argument of the wrong type, an unknown backend, mode
        or option (naming it, with the accepted ones), a value an option does not accept, or `mode` or
        `options` given to a backend that takes none.

    Example::

        model = kiln.compile(torch.nn.Linear(8, 8), mode="max-autotune")
        y = model(torch.randn(4, 8))

    Options (`options={name: value}`):
    """
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable)
    _check_flag("fullgraph", fullgraph)
    _check_flag("disable", disable)
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"kiln.compile: dynamic must be True, False or None, got {dynamic!r}")
    if not callable(model):
        raise TypeError(f"kiln.compile: expected a function, method or nn.Module, got {type(model).__name__}")
    compiler = resolve_backend(backend, mode, options)
    if disable:
        return model
    ctx = _context(compiler, fullgraph, dynamic)
    if isinstance(model, nn.Module):
        return OptimizedModule(model, ctx)
    return _compile_callable(model, ctx)


# the options, from the option table, in the docstring's indent
compile.__doc__ = compile.__doc__.rstrip() + "\n" + textwrap.indent(describe_options(), " " * 8) + "\n"


# Contexts of kiln.compile calls by (backend, fullgraph, dynamic): the backend resolved from a name and options
# (equal for equal ones), or the id of a backend object. Kept until kiln.reset(), as torch.compile keeps its cache
# entries (and their backend) on the code object: the compiled wrapper of one layer is often dropped before the
# next layer is compiled. Each holds its backend, so an id stays its own.
_shared_contexts: dict[tuple, CompileContext] = {}


def _context(compiler: Callable, fullgraph: bool, dynamic: bool | None, shared: bool = True) -> CompileContext:
    """The compile context of a kiln.compile call. Calls given the same backend share one, as torch.compile's
    cache entries are kept per code object and run for any call whose backend compares equal to theirs
    (`backend="inductor"` with the same mode and options, the same registered name, the same callable):
    `kiln.compile(layer)` for each of a model's twelve layers compiles the layer class's forward once, and every
    layer runs that entry. `shared=False`: a context of its own."""
    key = (compiler if shares_by_value(compiler) else id(compiler), fullgraph, dynamic)
    ctx = _shared_contexts.get(key) if shared else None
    if ctx is None:
        ctx = CompileContext(split_at_ddp_buckets(compiler), fullgraph=fullgraph, dynamic=dynamic)
        _contexts.add(ctx)
        if shared:
            _shared_contexts[key] = ctx
    return ctx


def _compile_backward_graph(gm: torch.fx.GraphModule) -> Callable:
    """Compiled autograd's default: a captured backward graph through kiln's default backend. Its sizes are
    those the engine keeps static (the engine passes the ones it saw change as symbolic `sizes`). Each graph gets
    a context of its own: its code was made for it and dies with it, where a shared context would keep it."""
    return OptimizedModule(gm, _context(resolve_backend("inductor", None, None), False, None, shared=False))


compiled_autograd.set_default_compiler(_compile_backward_graph)


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"kiln.compile: {name} must be a bool, got {type(value).__name__}")


def _compile_callable(fn: Callable, ctx: CompileContext) -> Callable:
    if isinstance(fn, functools.partial):
        # the wrapped function compiles; the bound arguments are passed on each call, so a tensor among them
        # is a graph input like any argument (torch.compile accepts partials the same way)
        inner = OptimizedModule(fn.func, ctx) if isinstance(fn.func, nn.Module) else _compile_callable(fn.func, ctx)
        bound = functools.partial(inner, *fn.args, **fn.keywords)
        bound._kiln_context = ctx
        return bound
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        compiled = ctx.function(fn.__func__)
        bound = functools.partial(compiled, fn.__self__)
        functools.update_wrapper(bound, fn.__func__)
        bound._kiln_context = ctx
        return bound
    if isinstance(fn, types.FunctionType):
        compiled = ctx.function(fn)
        compiled._kiln_context = ctx
        return compiled
    raise TypeError(f"kiln.compile: cannot compile {type(fn).__name__} objects (not a Python function or module)")


class OptimizedModule(nn.Module):
    """The module kiln.compile returns: shares parameters, buffers and state with `_orig_mod`."""

    def __init__(self, mod: nn.Module, ctx: CompileContext):
        super().__init__()
        self._orig_mod = mod
        self._kiln_context = ctx
        # a DDP wrapper runs natively (its hooks and collectives) around its inner module's compiled forward
        inner = compiled_inner_module(mod)
        self.__dict__["_kiln_inner"] = inner
        forward = type(mod if inner is None else inner).forward
        self._compiled_forward = ctx.function(forward) if isinstance(forward, types.FunctionType) else None
        self._compiled_hooked_call = None  # made on the first call with forward hooks (_hooked_call)

    def __getattr__(self, name: str):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value):
        # the wrapper's own attributes, and dunders such as `__class__` (fully_shard swaps the class of the
        # module it is given: this wrapper, not the module inside it)
        if (name in ("_orig_mod", "_kiln_context", "_compiled_forward", "_kiln_inner", "_compiled_hooked_call")
                or name.startswith("__") or "_orig_mod" not in self.__dict__.get("_modules", {})):
            super().__setattr__(name, value)
            if name == "_orig_mod":  # in `_modules`, so reading `self._orig_mod` goes through __getattr__:
                self.__dict__["_kiln_mod"] = value  # the per-call path reads this plain attribute instead
        else:
            setattr(self._orig_mod, name, value)

    def __call__(self, *args, **kwargs):
        if has_hooks(self):  # hooks on this module itself, e.g. fully_shard(kiln.compile(block)): nn.Module runs them
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        mod, inner, compiled = self._kiln_mod, self._kiln_inner, self._compiled_forward
        if compiled is None:
            return mod(*args, **kwargs)
        if inner is not None:  # DDP's forward, natively, calls its inner module, whose forward is compiled
            with forward_replaced(inner, compiled):
                return mod(*args, **kwargs)
        return call_module(mod, compiled, self._hooked_call, args, kwargs)

    def _hooked_call(self):
        """The module's call with its forward hooks, compiled once (kiln.capture.hooked_call)."""
        if self._compiled_hooked_call is None:
            self._compiled_hooked_call = self._kiln_context.function(call_module_with_hooks)
        return self._compiled_hooked_call

    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r})"


def disable(fn: Callable | None = None, recursive: bool = True):
    """Never compile `fn`: when compiled code calls it, the call runs eagerly (a graph break)."""
    if fn is None:
        return lambda f: disable(f, recursive)

    @functools.wraps(fn)
    def eager(*args, **kwargs):
        return fn(*args, **kwargs)

    eager.__kiln_disabled__ = True
    return eager


def mark_dynamic(t: torch.Tensor, index: int | list[int]) -> None:
    """Compile dimension(s) `index` of `t` with a symbolic size from the first call (torch._dynamo.mark_dynamic)."""
    dims = [index] if isinstance(index, int) else list(index)
    t._kiln_dynamic_dims = set(getattr(t, "_kiln_dynamic_dims", ())) | {d % t.dim() for d in dims}


def maybe_mark_dynamic(t: torch.Tensor, index: int | list[int]) -> None:
    """Like mark_dynamic; kiln specializes such a dimension if the program forces a single value."""
    mark_dynamic(t, index)


def mark_static(t: torch.Tensor, index: int | list[int] | None = None) -> None:
    """Never make dimension(s) `index` (all, if None) of `t` dynamic, whatever `dynamic=` says."""
    dims = range(t.dim()) if index is None else ([index] if isinstance(index, int) else index)
    t._kiln_static_dims = set(getattr(t, "_kiln_static_dims", ())) | {d % t.dim() for d in dims}


def graph_break() -> None:
    """An explicit graph break when compiled; does nothing when run eagerly."""


graph_break.__kiln_graph_break__ = True


def reset() -> None:
    """Forget every compiled frame of every kiln.compile call (torch._dynamo.reset), and the fallback counts."""
    for ctx in list(_contexts):
        for frame in ctx.frames.values():  # compiled wrappers hold their frame: empty it, not only the dict
            frame.entries.clear()
            frame.run_eagerly, frame.failures = False, 0
        ctx.frames.clear()
        ctx.functions.clear()
        ctx.records.clear()
    _shared_contexts.clear()
    fallbacks.reset()


def context_of(compiled: Any) -> CompileContext:
    """The CompileContext behind what kiln.compile returned."""
    ctx = getattr(compiled, "_kiln_context", None)
    if ctx is None:
        raise TypeError(f"{compiled!r} was not returned by kiln.compile")
    return ctx



"""kiln's inductor: ATen graph -> IR -> schedule -> kernels + wrapper -> a callable.

Public API (shared by the C++ and the Triton targets):
  compile_aten_graph(gm, example_inputs, options) -> callable   the inner compiler
  inductor(gm, example_inputs, options=None) -> callable        the full backend
      (torch-level graph -> kiln.autograd.aot_compile -> compile_aten_graph)

The stages, each usable alone (a target needs only the last two):
  kiln.lower.lower_graph(gm, example_inputs) -> ir.LoweredGraph   (kiln.lower.verify.verify checks it)
  kiln.schedule.fusion.schedule(graph, templates, options) -> Schedule of KernelGroup / ExternStep
      (templates: the target's `prepare(graph, options, device)`, Triton's max-autotune matmuls)
  kiln.schedule.memory.plan_memory(schedule) -> MemoryPlan
  target.generate_module(schedule) / target.load_kernels(...)     (codegen/cpp, codegen/triton)
  kiln.codegen.wrapper.generate_wrapper(schedule, plan, kernels)  the host program

Correctness first: a kernel kiln cannot generate or build runs its ops through ATen
(the rest of the graph keeps its kernels); a graph kiln cannot lower runs through
ATen as it is; both are fallbacks (kiln/fallbacks.py: counted, warned once, an
error under KILN_STRICT=1). An op with no lowering runs as an extern ATen call.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path
from typing import Callable

import torch
import torch.fx

from kiln import fallbacks
from kiln.codegen.target import select_target
from kiln.codegen.describe import fused_graph, name_kernels
from kiln.codegen.progress import StageProgress
from kiln.codegen.wrapper import ParameterDerived, generate_wrapper, unbound_globals
from kiln.config import config, validate_options
from kiln.lower import lower_graph
from kiln.lower.decompositions import decomposes, decomposition_table
from kiln.lower.verify import verify
from kiln.schedule.fusion import schedule
from kiln.schedule.memory import input_only_kernels, plan_memory

log = logging.getLogger("kiln.codegen")

_graph_ids = itertools.count()
_profiler = torch.autograd.profiler
_names_used: dict[str, int] = {}

# Observers installed by kiln.debug (nothing here imports it), called with each CompiledGraph and
# the options it was compiled with: the debug directory writer, diagrams.
GRAPH_LISTENERS: list[Callable[["CompiledGraph", dict], None]] = []
# Backend wrappers installed by kiln.debug, by the option that turns them on: wrapper(backend) -> backend.
BACKEND_WRAPPERS: dict[str, Callable[[Callable], Callable]] = {}


class CompiledGraph:
    """A compiled ATen graph: call it with the graph's positional inputs."""

    def __init__(self, call: Callable, artefacts: dict, profiled: Callable[[], Callable] | None = None,
                 kept: list[ParameterDerived] = ()):
        self.call = call
        self.artefacts = artefacts  # stage name -> printable text (IR, schedule, C++, wrapper)
        self._profiled, self._profiled_call = profiled, None  # builds `call` with each kernel a profiler range
        self.kept = list(kept)  # results kept across calls, computed from parameters

    def refresh(self, args: list) -> None:
        """Recompute what `kept` holds if a parameter among `args` changed: a CUDA graph replay reads it
        without running the wrapper."""
        for derived in self.kept:
            derived.refresh(args)

    def __call__(self, *args):
        if self._profiled is not None and _profiler._is_profiler_enabled:  # a module global: cheap per call
            if self._profiled_call is None:
                self._profiled_call = self._profiled()
            with torch.profiler.record_function(f"kiln: {self.artefacts.get('name', 'graph')}"):
                return self._profiled_call(*args)
        return self.call(*args)

    @property
    def num_kernels(self) -> int:
        return self.artefacts.get("num_kernels", 0)


def _needs_retrace(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        if n.op != "call_function" or isinstance(n.meta.get("val"), (int, torch.SymInt)):
            continue
        if "val" not in n.meta or decomposes(n):
            return True
    return False


def _has_mutation(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _retrace(gm, example_inputs):
    """Re-trace `gm` through kiln's decompositions so every node is core ATen with `meta['val']`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    fake = [t for t in example_inputs if isinstance(t, torch._subclasses.FakeTensor)]
    if fake:
        with fake[0].fake_mode:
            return make_fx(gm, decomposition_table=decomposition_table(), tracing_mode="real")(*example_inputs)
    return make_fx(gm, decomposition_table=decomposition_table(), tracing_mode="fake")(*example_inputs)


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None) -> Callable:
    """The inner compiler: an ATen-level FX graph -> a callable over real tensors (positional)."""
    options = validate_options(None, options) if options is None else options
    name = _graph_name(gm)
    try:
        compiled = _compile(gm, example_inputs, options, name)
    except fallbacks.KilnStrictError:
        raise
    except Exception as e:  # correctness first: never fail the user's program (unless KILN_STRICT=1)
        log.debug("compile failure", exc_info=True)
        fallbacks.record("graph", name, e, stage="compile")
        compiled = CompiledGraph(lambda *args: gm(*args), {"fallback": f"{type(e).__name__}: {e}", "name": name,
                                                           "aten_graph": gm.print_readable(print_output=False)})
    for listener in GRAPH_LISTENERS:
        listener(compiled, options)
    return compiled


def _graph_name(gm: torch.fx.GraphModule) -> str:
    """`graph3/forward` for the forward graph of kiln's captured graph 3; `aten0` for a graph from elsewhere."""
    aot = gm.meta.get("kiln.aot", {})
    owner = aot.get("name", "")
    name = f"{owner}/{aot.get('kind', 'graph')}" if owner.startswith("graph") else f"aten{next(_graph_ids)}"
    _names_used[name] = _names_used.get(name, 0) + 1
    return name if _names_used[name] == 1 else f"{name}_{_names_used[name]}"


def _compile(gm, example_inputs, options, name) -> CompiledGraph:
    progress = StageProgress(name, ["decompose", "lower", "schedule", "codegen", "build"])
    try:
        return _compile_stages(gm, example_inputs, options, name, progress)
    finally:
        progress.close()


def _compile_stages(gm, example_inputs, options, name, progress) -> CompiledGraph:
    times = {}
    t0 = time.perf_counter()
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if devices - {"cpu", "cuda"} or len(devices) > 1:  # C++ kernels read host memory, Triton kernels CUDA memory
        raise NotImplementedError(f"inputs on {', '.join(sorted(devices))}: no code generator for this mix")
    if _has_mutation(gm):
        raise NotImplementedError("in-place ops in the ATen graph (expected a functional graph)")
    if _needs_retrace(gm):
        gm = _retrace(gm, example_inputs)
    times["decompose"] = time.perf_counter() - t0
    return fallbacks.with_kernel_fallbacks(
        name, lambda through_aten: _generate(gm, example_inputs, options, name, progress, times, through_aten))


def _generate(gm, example_inputs, options, name, progress, times, through_aten: frozenset) -> CompiledGraph:
    """Lower, schedule, generate and build `gm`, with the FX nodes in `through_aten` run as externs."""
    progress.advance("lower")
    t = time.perf_counter()
    target = select_target(gm, example_inputs, options)
    on_gpu = target.device.startswith("cuda")
    # channels-last only where no activation leaves the graph for a backward that expects eager's layout
    inference = gm.meta.get("kiln.aot", {}).get("kind") == "inference"
    graph = lower_graph(gm, example_inputs, pad_matmul_operands=on_gpu and bool(options.get("shape_padding", False)),
                        channels_last_convs=on_gpu and inference, through_aten=through_aten)
    verify(graph)
    times["lower"] = time.perf_counter() - t
    progress.advance("schedule")
    t = time.perf_counter()
    prepare = getattr(target.module, "prepare", None)  # Triton: matmul templates (max_autotune), shape padding
    sched = schedule(graph, prepare(graph, options, target.device) if prepare else None, options)
    name_kernels(sched)
    # an inference graph's parameters rarely change between calls: kernels reading them alone run once per version
    plan = plan_memory(sched, input_only_kernels(sched) if inference else [])
    times["schedule"] = time.perf_counter() - t
    progress.advance("codegen")
    t = time.perf_counter()
    with fallbacks.kernel_origins(sched, graph):
        source, kernels = target.module.generate_module(sched)
        wrapper_src, namespace = generate_wrapper(sched, plan, kernels, device=target.device)
        times["codegen"] = time.perf_counter() - t
        progress.advance("build")
        t = time.perf_counter()
        namespace.update(target.module.load_kernels(source, kernels))
        times["build"] = time.perf_counter() - t
    progress.advance("")
    wrapper_code = compile(wrapper_src, f"<kiln wrapper {name}>", "exec")
    exec(wrapper_code, namespace)
    missing = unbound_globals(wrapper_code, namespace)
    for launcher in (namespace[k] for k in kernels if hasattr(namespace.get(k), "__code__")):  # Triton's
        missing += unbound_globals(launcher.__code__, launcher.__globals__)
    if missing:
        raise NameError(f"the generated wrapper reads names it never binds: {', '.join(missing)}")
    # IR, schedule and memory plan print on demand (str()): formatting big sympy indices costs seconds
    artefacts = {"aten_graph": gm.print_readable(print_output=False), "ir": graph, "schedule": sched,
                 "memory": plan, target.artefact: source, "wrapper.py": wrapper_src,
                 "num_kernels": len(kernels), "kernel_names": list(kernels), "times": times, "name": name,
                 "fused_graph": fused_graph(sched)}
    log.info("%s: %d kernels, %d externs, %s", name, len(kernels), len(sched.steps) - len(kernels),
             ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in times.items()))
    kept = [v for v in namespace.values() if isinstance(v, ParameterDerived)]
    return CompiledGraph(namespace["call"], artefacts, lambda: _profiled_call(wrapper_src, namespace, kernels, name),
                         kept)


def _profiled_call(wrapper_src: str, namespace: dict, kernels: dict, name: str) -> Callable:
    """The wrapper again, each kernel call a `torch.profiler` range named after the kernel."""

    def ranged(kernel: str, fn: Callable) -> Callable:
        def run(*args):
            with torch.profiler.record_function(kernel):
                return fn(*args)
        return run

    ns = dict(namespace)
    ns.update({k: ranged(k, namespace[k]) for k in kernels if k in namespace})
    exec(compile(wrapper_src, f"<kiln wrapper {name} (profiled)>", "exec"), ns)
    return ns["call"]


def debug_dir() -> Path:
    return Path(config.debug_dir or os.environ.get("KILN_DEBUG_DIR") or "kiln_debug")


def fuses(target) -> bool:
    """Does the code generator fuse `target` into kernels (it has a lowering), rather than call ATen?"""
    from kiln.lower.ops import LOWERINGS

    return target in LOWERINGS


def inductor(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None) -> Callable:
    """kiln's code generator as a torch.compile-style backend (`torch.compile(m, backend=kiln.inductor)`)."""
    from kiln.autograd import aot_compile

    options = validate_options(None, options) if options is None else options
    for option, wrap in BACKEND_WRAPPERS.items():
        if options.get(option):
            return wrap(lambda g, inputs: inductor(g, inputs, {**options, option: False}))(gm, example_inputs)
    graphs: list[CompiledGraph] = []
    graph_id = gm.meta.get("kiln.graph_id") if isinstance(getattr(gm, "meta", None), dict) else None
    name = f"graph{graph_id}" if graph_id is not None else "inductor"
    progress = StageProgress(name, None, first="autograd")
    pool = None  # mode="reduce-overhead": each ATen graph recorded into CUDA graphs, one memory pool for them all
    if options.get("triton.cudagraphs"):
        from kiln.runtime.cudagraphs import CUDAGraphPool

        pool = CUDAGraphPool.for_graph(gm, example_inputs, name)

    def compiler(aten_gm, inputs):
        progress.advance(aten_gm.meta.get("kiln.aot", {}).get("kind", "graph"))
        graphs.append(compile_aten_graph(aten_gm, inputs, options))
        return graphs[-1] if pool is None else pool.wrap(graphs[-1], aten_gm, inputs)

    compiler.fuses = fuses
    try:
        compiled = aot_compile(gm, example_inputs, compiler, decompositions=decomposition_table(), name=name)
    finally:
        progress.close()
    compiled.compiled_graphs = graphs  # every CompiledGraph behind it (lazily compiled variants join later)
    compiled.cudagraph_pool = pool
    return compiled


__all__ = ["compile_aten_graph", "inductor", "CompiledGraph"]

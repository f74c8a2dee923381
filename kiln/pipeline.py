"""kiln's inductor, the default backend: a captured graph -> ATen graphs -> kernels + wrapper -> a callable.

    inductor(gm, example_inputs, options)           the backend (`kiln.inductor`, torch.compile's contract):
        kiln.autograd.aot_compile(gm, ..., compiler=compile_aten_graph)   one call per ATen graph
    compile_aten_graph(gm, example_inputs, options) one ATen graph through the stages below

The stages of one ATen graph, in the order `_compile_stages` and `_kernel_stages` run them, one line each:

    decompose    ATen graph -> core ATen, every node with meta["val"]     kiln/lower/decompositions.py
    lower        -> loop-level IR (LoweredGraph), checked by the verifier  kiln/lower/, kiln/lower/verify.py
    schedule     -> Schedule: kernel groups and extern calls in order      kiln/schedule/fusion.py
    plan memory  -> MemoryPlan: when each buffer dies, whose storage a new one reuses   kiln/schedule/memory.py
    generate     -> kernel source (the target's printer) and the wrapper   kiln/codegen/
    build        -> kernels compiled and loaded, the wrapper exec'd        the target, kiln/runtime/cache.py

A graph compiled before (by any process) comes from the compile cache instead (kiln/runtime/graph_cache.py):
only its build runs, from the kernels' source and the wrapper's source kept there (`from_product`).

Every stage runs through `Stages`, the one place that times it, moves the progress bar and logs it.
Each stage is handed only the option fields it reads; `select_target` binds the ones the target reads.

Correctness first: a kernel kiln cannot generate or build runs its ops through ATen (the rest of the graph
keeps its kernels); a graph kiln cannot lower runs through ATen as it is; both are fallbacks (kiln/fallbacks.py:
counted, warned once, an error under KILN_STRICT=1). An op with no lowering runs as an extern ATen call.
"""
from __future__ import annotations

import builtins
import dataclasses
import functools
import itertools
import json
import logging
import operator
import os
import time
from collections.abc import Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import fallbacks
from kiln.autograd import aot_compile
from kiln.capture import bytecode
from kiln.codegen import triton as triton_target
from kiln.codegen.cpp import PRELUDE
from kiln.codegen.describe import FusedGraph, name_kernels
from kiln.codegen.target import Target, select_target
from kiln.codegen.wrapper import ParameterDerived, base_namespace, generate_wrapper
from kiln.config import CompileOptions, as_options, config, field_name
from kiln.lower import ir, lower_graph
from kiln.lower.collectives import place_collectives
from kiln.lower.constant_masks import drop_masks_that_mask_nothing
from kiln.lower.conv_layout import prefers_channels_last
from kiln.lower.decompose_nodes import decompose_nodes
from kiln.lower.decompositions import decomposes, decomposition_table
from kiln.lower.ops import LOWERINGS
from kiln.lower.verify import verify
from kiln.progress import StageProgress
from kiln.runtime import code_cache, collector, graph_cache, symbolic_sizes, triton_cache
from kiln.runtime.cudagraphs import CUDAGraphPool
from kiln.runtime.current_device import with_current_device
from kiln.runtime.host_scalars import is_host_scalar
from kiln.schedule.fusion import Schedule, schedule
from kiln.schedule.input_writes import write_into_inputs
from kiln.schedule.memory import MemoryPlan, input_only_kernels, plan_memory
from kiln.schedule.order import sink_outputs_for_memory

log = logging.getLogger("kiln.pipeline")
log_output_code = logging.getLogger("kiln.output_code")

STAGES = ("decompose", "lower", "schedule", "plan memory", "generate", "build")

_graph_ids = itertools.count()
_profiler = torch.autograd.profiler
_names_used: dict[str, int] = {}

# Observers installed by kiln.debug (nothing here imports it), called with each CompiledGraph and
# the CompileOptions it was compiled with: the debug directory writer, diagrams.
GRAPH_LISTENERS: list[Callable[[CompiledGraph, CompileOptions], None]] = []
# Backend wrappers installed by kiln.debug, by the option that turns them on: wrapper(backend) -> backend.
BACKEND_WRAPPERS: dict[str, Callable[[Callable], Callable]] = {}
# Wrappers of `compile_aten_graph` installed by kiln.debug: hook(compile) -> compile, each compile called as
# compile(aten_gm, example_inputs, options). The minifier's (KILN_REPRO_AFTER=aot) shrinks a failing ATen graph.
ATEN_COMPILER_HOOKS: list[Callable[[Callable], Callable]] = []


# ----------------------------------------------------------------------------- the pipeline


def _compile_stages(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions, name: str,
                    run: Stages) -> CompiledGraph:
    _start_gpu_build(_gpu_of(example_inputs))  # kernels will be built: the workers start during the lowering
    writes = input_writes(gm, options)  # read before decompose, whose re-trace is a new module
    gm = run("decompose", decompose, gm, example_inputs, options.fallback_random)
    target = select_target(gm, example_inputs, options.cpu_backend, options.max_autotune, options.shape_padding)
    return fallbacks.with_kernel_fallbacks(
        name, lambda through_aten: _kernel_stages(gm, example_inputs, options, name, run, target, through_aten,
                                                  writes))


def _kernel_stages(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions, name: str, run: Stages,
                   target: Target, through_aten: frozenset, writes: tuple = ()) -> CompiledGraph:
    """The stages after decompose, with the FX nodes in `through_aten` run as ATen externs: those of kernels that
    failed to generate or build in an earlier attempt (kiln/fallbacks.py)."""
    graph = run("lower", lower, gm, example_inputs, target, options.shape_padding, through_aten)
    sched = run("schedule", schedule_kernels, graph, target, options.epilogue_fusion, writes)
    plan = run("plan memory", plan_buffers, sched, _is_inference(gm))
    with fallbacks.kernel_origins(sched, graph):  # a kernel that fails names the FX nodes it computes
        code = run("generate", generate, sched, plan, target)
        product = _product(code, target)  # before build: it runs the wrapper in (and adds to) the namespace
        namespace = run("build", build, code, target, name)
    compiled = _compiled_graph(gm, graph, sched, plan, code, namespace, target, name, run.times)
    compiled.restrided_outputs = restrided_outputs(gm, graph)
    if product is not None:
        product["restrided_outputs"] = [[k, list(stride)] for k, stride in compiled.restrided_outputs]
        graph_cache.record_binaries(product, namespace)
    compiled.product = product
    return compiled


def restrided_outputs(gm: torch.fx.GraphModule, graph: ir.LoweredGraph) -> tuple[tuple[int, tuple], ...]:
    """(output index, strides) of each output the lowered graph returns with other strides than the traced
    graph's: a forward's activations saved channels-last for its backward (kiln/lower/graph.py `_output`)."""
    output = next(iter(gm.graph.find_nodes(op="output")))
    metas = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None
             for n in pytree.tree_flatten(output.args[0])[0]]  # as lower_graph flattens them
    out = []
    for k, (ref, meta) in enumerate(zip(graph.outputs, metas)):
        if not (isinstance(ref, ir.TensorRef) and isinstance(meta, torch.Tensor)):
            continue
        stride = tuple(ref.layout.stride)
        if all(isinstance(s, int) or getattr(s, "is_Integer", False) for s in stride) and any(
                n != 1 and int(a) != b for n, a, b in zip(meta.shape, stride, meta.stride())):
            out.append((k, tuple(int(s) for s in stride)))
    return tuple(out)


def _cached_or_compiled(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions, name: str,
                        run: Stages) -> CompiledGraph:
    """The graph from the compile cache (kiln/runtime/graph_cache.py) if an earlier compile stored it, else
    compiled through every stage and stored (when it compiled with no fallback: a product replays no
    fallback record)."""
    shape_env = symbolic_sizes.shape_env_of(example_inputs)
    key = _product_key(gm, example_inputs, options, shape_env)
    product = graph_cache.lookup(key) if key else None
    if product is not None:
        try:
            symbolic_sizes.replay_guards(shape_env, product.get("shape_guards", []))
            compiled = run("build", from_product, product, gm, example_inputs, options, name, run.times)
            graph_cache.stats["hits"] += 1
            return compiled
        except symbolic_sizes.GuardsDoNotHold as e:  # made for other sizes: made again for these
            log.info("kiln: %s: the cached compile is for other sizes (%s); compiling again", name, e)
        except Exception as e:  # noqa: BLE001 -- a product that does not load: compile as if it were not there
            log.warning("kiln: %s: the cached compile could not be used (%s: %s); compiling again", name,
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            graph_cache.forget(key)
    recorded = len(fallbacks.records())
    guards_before = len(shape_env.guards) if shape_env is not None else 0
    graph_cache.stats["compiles"] += 1
    collector.resume()
    compiled = _compile_stages(gm, example_inputs, options, name, run)
    product = getattr(compiled, "product", None)
    if key and product is not None and len(fallbacks.records()) == recorded:
        product["shape_guards"] = _guards_since(shape_env, guards_before)
        if product["shape_guards"] is not None:
            graph_cache.store(key, product)
    return compiled


def _guards_since(shape_env, count: int) -> list | None:
    """The size guards a compile added (kept with its product, added again by a process that loads it); None
    where one cannot be described (the product is then not kept)."""
    try:
        return symbolic_sizes.guards_since(shape_env, count)
    except graph_cache.Uncacheable as e:
        log.info("graph not cached: %s", e)
        graph_cache.stats["uncacheable"] += 1
        return None


def _caching(options: CompileOptions) -> bool:
    """Does this compile use the compile cache? Not for the debug directory and the accuracy check: they read
    every stage's artefacts (the traces, the IR, the schedule)."""
    return config.graph_cache and not (options.check_accuracy or options.trace_enabled
                                       or os.environ.get("KILN_DEBUG_DIR"))


def _aot_cache_key(options: CompileOptions) -> str | None:
    """What names this code generator to the AOT autograd cache (kiln/autograd/aot_cache.py): its options; None
    where the compile is not cached."""
    return json.dumps(["kiln.inductor", options.as_dict()], sort_keys=True, default=str) if _caching(options) \
        else None


def _product_key(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions,
                 shape_env=None) -> str | None:
    if not _caching(options):
        return None
    try:
        return graph_cache.graph_key(gm, example_inputs, gm.meta.get("kiln.aot", {}).get("kind", "graph"),
                                     options.as_dict(), input_writes(gm, options),
                                     symbolic_sizes.describe_env(shape_env))
    except Exception as e:  # noqa: BLE001 -- Uncacheable, or a value the key cannot read: compiled, not cached
        log.debug("not cached: %s: %s", type(e).__name__, e)
        graph_cache.stats["uncacheable"] += 1
        return None


def _product(code: GeneratedCode, target: Target) -> dict | None:
    """What the compile cache keeps of a generated graph (None where it cannot describe it)."""
    if not config.graph_cache:
        return None
    try:
        return graph_cache.encode_product(target.name, code.source, code.wrapper, code.kernels, code.namespace,
                                          base_namespace())
    except Exception as e:  # noqa: BLE001 -- Uncacheable, or a value it cannot describe: the compile stands
        log.info("%s graph not cached: %s: %s", target.name, type(e).__name__, e)  # every process compiles it
        graph_cache.stats["uncacheable"] += 1
        return None


def from_product(product: dict, gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions,
                 name: str, times: dict) -> CompiledGraph:
    """A compiled graph from a cached product: its kernels loaded (built if their library is not cached) and its
    wrapper run in the namespace the product describes. No stage before build runs."""
    target = select_target(gm, example_inputs, options.cpu_backend, options.max_autotune, options.shape_padding)
    if target.name != product["target"]:
        raise ValueError(f"the product is for the {product['target']} target, the graph's is {target.name}")
    kernels, namespace = graph_cache.decode_product(product, base_namespace())
    code = GeneratedCode(product["source"], kernels, product["wrapper"], namespace)
    namespace = build(code, target, name)
    compiled = _loaded_graph(gm, code, namespace, target, name, times, from_cache=True)
    compiled.restrided_outputs = tuple((k, tuple(stride)) for k, stride in product.get("restrided_outputs", ()))
    return compiled


class Stages:
    """Runs the named stages of one compile: the one place that times each stage, moves the progress bar on
    a terminal, and logs the stage's time (`kiln.pipeline`, DEBUG). `times` (stage -> seconds) is kept in the
    compiled graph's artefacts, which the report and the debug directory show."""

    def __init__(self, name: str, stages: tuple[str, ...] = STAGES):
        self.name, self.stages, self.times = name, stages, {}
        self.progress = StageProgress(name, list(stages))

    def __call__(self, stage: str, fn: Callable, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.times[stage] = time.perf_counter() - start
            log.debug("%s: %s %.1f ms", self.name, stage, self.times[stage] * 1000)
            later = self.stages[self.stages.index(stage) + 1:]
            self.progress.advance(later[0] if later else "")

    def summary(self) -> str:
        return ", ".join(f"{stage} {seconds * 1000:.0f} ms" for stage, seconds in self.times.items())

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc) -> None:
        self.progress.close()


# ----------------------------------------------------------------------------- the stages


def decompose(gm: torch.fx.GraphModule, example_inputs: list, fallback_random: bool = False) -> torch.fx.GraphModule:
    """Refuse a graph no target can compile, then decompose the ops kiln decomposes (random ops stay whole under
    `fallback_random`): each traced alone and spliced in (lower/decompose_nodes.py), or, where one cannot be (a
    node without `meta['val']`, symbolic sizes), the whole graph re-traced through kiln's decompositions."""
    devices = _tensor_devices(gm, example_inputs)
    if devices - {"cpu", "cuda"}:  # C++ kernels read host memory, Triton kernels CUDA memory
        raise NotImplementedError(f"tensors on {', '.join(sorted(devices))}: no code generator for these devices")
    if _has_mutation(gm):
        raise NotImplementedError("in-place ops in the ATen graph (expected a functional graph)")
    table = decomposition_table(fallback_random)
    decomposed = decompose_nodes(gm, lambda n: _needs_decomposing(n, fallback_random), table)
    return decomposed if decomposed is not None else _retrace(gm, example_inputs, fallback_random)


def lower(gm: torch.fx.GraphModule, example_inputs: list, target: Target, shape_padding: bool,
          through_aten: frozenset = frozenset()) -> ir.LoweredGraph:
    """The loop-level IR of `gm`, verified, with the nodes in `through_aten` left as ATen externs. On the GPU,
    matmul operands may be stored padded (`shape_padding`), and convolutions run channels-last where
    kiln/lower/conv_layout.py's rule says they are faster so (forward, backward and inference graphs)."""
    on_gpu = target.device.startswith("cuda")
    place_collectives(gm)
    graph = lower_graph(gm, example_inputs, pad_matmul_operands=on_gpu and shape_padding,
                        channels_last_convs=runs_channels_last(gm, target), through_aten=through_aten)
    verify(graph)
    return graph


def runs_channels_last(gm: torch.fx.GraphModule, target: Target) -> bool:
    """Whether `gm`'s 2-d convolutions run channels-last: on the GPU (cuDNN's layout), by conv_layout's rule.
    On the CPU, ATen's convolutions are fastest in eager's layout."""
    return target.device.startswith("cuda") and prefers_channels_last(gm, _is_inference(gm))


def schedule_kernels(graph: ir.LoweredGraph, target: Target, epilogue_fusion: bool,
                     writes: tuple[tuple[int, int], ...] = ()) -> Schedule:
    """Kernel groups and extern calls in order, each kernel named after what it fuses; the target first rewrites
    what it makes templates of (Triton's matmuls). Kernels computing graph outputs move later where that lowers
    the peak of live bytes (kiln/schedule/order.py). The new values of inputs in `writes` ((graph output, graph
    input) pairs) are stored into those inputs where that is safe (kiln/schedule/input_writes.py)."""
    sched = schedule(graph, target.prepare(graph), epilogue_fusion=epilogue_fusion)
    if writes:
        renamed = write_into_inputs(sched, writes)
        if renamed:
            log.debug("new input values written in place: %s", ", ".join(f"{b} -> {i}" for b, i in renamed.items()))
    moved = sink_outputs_for_memory(sched)
    if moved:
        log.debug("%d kernels computing graph outputs moved later (lower peak memory)", moved)
    name_kernels(sched)
    return sched


def input_writes(gm: torch.fx.GraphModule, options: CompileOptions) -> tuple[tuple[int, int], ...]:
    """The (graph output, graph input) pairs of `gm` whose output is the input's new value (kiln.autograd
    declares them), where the runtime lets kernels write into inputs: not where it re-runs kernels on the
    call's own arguments (max-autotune's benchmarks) or records them (CUDA graphs)."""
    if options.max_autotune or options.triton_cudagraphs:
        return ()
    meta = gm.meta.get("kiln.aot", {}) if isinstance(getattr(gm, "meta", None), dict) else {}
    return tuple(meta.get("input_writes", ()))


def plan_buffers(sched: Schedule, inference: bool) -> MemoryPlan:
    """When each buffer dies and whose storage it reuses. An inference graph's parameters rarely change between
    calls: kernels reading them alone run once per version of them."""
    return plan_memory(sched, input_only_kernels(sched) if inference else [])


@dataclasses.dataclass
class GeneratedCode:
    """What the generate stage prints: the kernels' source, the kernels, and the wrapper with its namespace."""

    source: str
    kernels: dict
    wrapper: str
    namespace: dict


def generate(sched: Schedule, plan: MemoryPlan, target: Target) -> GeneratedCode:
    """Kernel source from the target's printer, and the wrapper (the host program)."""
    source, kernels = target.generate(sched)
    wrapper, namespace = generate_wrapper(sched, plan, kernels, device=target.device)
    return GeneratedCode(source, kernels, wrapper, namespace)


def build(code: GeneratedCode, target: Target, name: str) -> dict:
    """Compile and load the kernels, run the wrapper module; its namespace, `call` included. A name the wrapper or
    a launcher reads but nothing binds fails here, not on a later call."""
    namespace = code.namespace
    namespace.update(target.load(code.source, code.kernels))
    wrapper_code = code_cache.compiled(code.wrapper, f"<kiln wrapper {name}>")
    exec(wrapper_code, namespace)
    missing = unbound_globals(wrapper_code, namespace)
    for launcher in (namespace[k] for k in code.kernels if hasattr(namespace.get(k), "__code__")):  # Triton's
        missing += unbound_globals(launcher.__code__, launcher.__globals__)
    if missing:
        raise NameError(f"the generated wrapper reads names it never binds: {', '.join(missing)}")
    return namespace


def unbound_globals(code, namespace: dict) -> list[str]:
    """The global names that `code` (the wrapper module's or a launcher's) and the functions inside it read
    but that neither `namespace` nor the builtins define.

    Each is a `NameError` waiting for the first call that reaches it (a size symbol read by a computation
    hoisted out of `call`, where the symbols are bound): checked once at compile time, where the graph can
    still fall back to ATen, rather than failing every call."""
    missing = {f"{name} (in {code.co_name})": None for name in bytecode.global_reads(code)
               if name not in namespace and not hasattr(builtins, name)}
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            missing.update(dict.fromkeys(unbound_globals(const, namespace)))
    return list(missing)


# ----------------------------------------------------------------------------- the compiled graph


class CompiledGraph:
    """A compiled ATen graph: call it with the graph's positional inputs, or `boxed_call` it with one list.

    `call` takes one list of the inputs (the boxed convention), which it may empty."""

    def __init__(self, call: Callable, artefacts: dict, profiled: Callable[[], Callable] | None = None,
                 kept: list[ParameterDerived] = ()):
        self.call = call
        self.artefacts = artefacts  # stage name -> printable text (IR, schedule, C++, wrapper)
        self._profiled, self._profiled_call = profiled, None  # builds `call` with each kernel a profiler range
        self.kept = list(kept)  # results kept across calls, computed from parameters
        self.product: dict | None = None  # what the compile cache keeps of it (kiln/runtime/graph_cache.py)
        # (output index, strides) of outputs returned in another layout than the traced graph's (a forward's
        # activations saved channels-last): the backward is compiled for them (kiln/autograd/aot.py)
        self.restrided_outputs: tuple[tuple[int, tuple], ...] = ()

    def refresh(self, args: list) -> None:
        """Recompute what `kept` holds if a parameter among `args` changed: a CUDA graph replay reads it
        without running the wrapper."""
        for derived in self.kept:
            derived.refresh(args)

    def __call__(self, *args):
        return self.boxed_call(list(args))

    def boxed_call(self, args: list):
        """Run on one list of the graph's inputs, which the call empties: each input is dropped after its last
        use (`kiln.autograd.runtime.boxed` calls this; a backward's saved tensors are freed as it runs)."""
        if self._profiled is not None and _profiler._is_profiler_enabled:  # a module global: cheap per call
            if self._profiled_call is None:
                self._profiled_call = self._profiled()
            with torch.profiler.record_function(f"kiln: {self.artefacts.get('name', 'graph')}"):
                return self._profiled_call(args)
        return self.call(args)

    @property
    def num_kernels(self) -> int:
        return self.artefacts.get("num_kernels", 0)


def _compiled_graph(gm, graph, sched, plan, code: GeneratedCode, namespace: dict, target: Target, name: str,
                    times: dict) -> CompiledGraph:
    # IR, schedule and memory plan print on demand (str()): formatting big sympy indices costs seconds
    return _loaded_graph(gm, code, namespace, target, name, times, ir=graph, schedule=sched, memory=plan,
                         fused_graph=FusedGraph(sched))


class ReadableGraph:
    """An ATen graph's readable code, printed when it is read (str()): a large graph's costs more to print than a
    warm start spends on it otherwise."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm

    def __str__(self) -> str:
        return self.gm.print_readable(print_output=False)

    def __contains__(self, text: str) -> bool:
        """`"aten.bernoulli" in artefacts["aten_graph"]` reads as it did when the artefact was the string."""
        return text in str(self)


def _loaded_graph(gm, code: GeneratedCode, namespace: dict, target: Target, name: str, times: dict,
                  **stage_artefacts) -> CompiledGraph:
    """The CompiledGraph of a built wrapper, compiled now or loaded from the cache: its call, the artefacts every
    compile has, and `stage_artefacts` (what the stages before build printed, or that it came from the cache)."""
    artefacts = {"aten_graph": ReadableGraph(gm), target.artefact: code.source,
                 "wrapper.py": code.wrapper, "num_kernels": len(code.kernels), "kernel_names": list(code.kernels),
                 "times": times, "name": name, **stage_artefacts}
    kept = [v for v in namespace.values() if isinstance(v, ParameterDerived)]

    def runnable(call: Callable) -> Callable:
        return with_current_device(call, target.device)

    return CompiledGraph(runnable(namespace["call"]), artefacts,
                         lambda: runnable(_profiled_call(code.wrapper, namespace, code.kernels, name)), kept)


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


# ----------------------------------------------------------------------------- entry points


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs: list,
                       options: CompileOptions | dict | None = None) -> Callable:
    """The inner compiler: an ATen-level FX graph -> a callable over real tensors (positional)."""
    options = as_options(options)
    name = _graph_name(gm)
    try:
        with Stages(name) as run:
            compiled = _cached_or_compiled(gm, example_inputs, options, name, run)
        log.info("%s: %d kernels%s, %s", name, compiled.num_kernels,
                 " (from the compile cache)" if compiled.artefacts.get("from_cache") else "", run.summary())
        _log_output_code(compiled)
    except fallbacks.KilnStrictError:
        raise
    except Exception as e:  # correctness first: never fail the user's program (unless KILN_STRICT=1)
        log.debug("compile failure", exc_info=True)
        fallbacks.record("graph", name, e, stage="compile")
        compiled = CompiledGraph(lambda args: gm(*args), {"fallback": f"{type(e).__name__}: {e}", "name": name,
                                                           "aten_graph": gm.print_readable(print_output=False)})
    for listener in GRAPH_LISTENERS:
        listener(compiled, options)
    return compiled


def inductor(gm: torch.fx.GraphModule, example_inputs: list, options: CompileOptions | dict | None = None) -> Callable:
    """kiln's code generator as a torch.compile-style backend (`torch.compile(m, backend=kiln.inductor)`).

    `options`: a CompileOptions, an `options=` dict as kiln.compile takes it, or None (every default)."""
    options = as_options(options)
    wrapping = next((option for option in BACKEND_WRAPPERS if getattr(options, field_name(option))), None)
    if wrapping is not None:  # e.g. check_accuracy: the wrapper calls this backend again, with the option off
        unwrapped = dataclasses.replace(options, **{field_name(wrapping): False})
        return BACKEND_WRAPPERS[wrapping](lambda g, inputs: inductor(g, inputs, unwrapped))(gm, example_inputs)
    graphs: list[CompiledGraph] = []
    graph_id = gm.meta.get("kiln.graph_id") if isinstance(getattr(gm, "meta", None), dict) else None
    name = f"graph{graph_id}" if graph_id is not None else "inductor"
    progress = StageProgress(name, None, first="autograd")
    pool = None  # mode="reduce-overhead": each ATen graph recorded into CUDA graphs, one memory pool for them all
    if options.triton_cudagraphs:
        pool = CUDAGraphPool.for_graph(gm, example_inputs, name)

    compile_graph = compile_aten_graph
    for hook in ATEN_COMPILER_HOOKS:
        compile_graph = hook(compile_graph)

    def compiler(aten_gm, inputs):
        progress.advance(aten_gm.meta.get("kiln.aot", {}).get("kind", "graph"))
        graphs.append(compile_graph(aten_gm, inputs, options))
        if pool is None:
            return graphs[-1]
        wrapped = pool.wrap(graphs[-1], aten_gm, inputs)
        wrapped.restrided_outputs = graphs[-1].restrided_outputs  # a replay returns the recording's layouts
        return wrapped

    compiler.fuses = fuses
    gpu = _gpu_of(example_inputs)
    compiler.before_trace = functools.partial(_start_gpu_build, gpu)  # the device, not the inputs: the compiler
    # lives as long as the compiled program, which must not keep its example tensors
    if drop_masks_that_mask_nothing(gm):
        log.info("%s: attention masks that mask nothing dropped (fused attention runs)", name)
    try:
        table = functools.partial(decomposition_table, options.fallback_random)  # built if a graph is traced
        compiled = aot_compile(gm, example_inputs, compiler, decompositions=table, name=name,
                               cache=_aot_cache_key(options))
    finally:
        progress.close()
    compiled.compiled_graphs = graphs  # every CompiledGraph behind it (lazily compiled variants join later)
    compiled.cudagraph_pool = pool
    return compiled


def _start_gpu_build(device: str | None) -> None:
    """For a graph on a GPU whose kernels will be built, the Triton build workers start now: their start (a
    Python process importing torch and Triton each) overlaps the autograd trace (`before_trace`, called where the
    AOT cache has no ATen graphs for a variant it can keep, or caching is off) or the lowering (where the compile
    cache has no product).
    A warm process, whose graphs all come from the caches, starts none: their imports would compete with its
    first steps for the CPU. Nor does it hash Triton's installation (`triton_key`), which only Triton's JIT needs:
    its kernels come from kiln's cache (kiln/runtime/triton_binaries.py). `device`: the graph's GPU (None for a
    CPU graph: nothing to start)."""
    if device is not None:
        triton_target.start_build_workers(device)
        if not triton_target.interpreting():
            triton_cache.hash_triton_early()  # every lookup of Triton's JIT needs it first


def _gpu_of(example_inputs: list) -> str | None:
    """The device of the first CUDA tensor among `example_inputs`, or None."""
    return next((str(t.device) for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda), None)


def fuses(target) -> bool:
    """Does the code generator fuse `target` into kernels (it has a lowering), rather than call ATen?"""
    return target in LOWERINGS


# ----------------------------------------------------------------------------- helpers


def _log_output_code(compiled: CompiledGraph) -> None:
    """KILN_LOGS=output_code (TORCH_LOGS=output_code): the kernels and the wrapper of one ATen graph, under the
    graph's name, as the build stage loaded them (after any kernel fell back to ATen)."""
    if not log_output_code.isEnabledFor(logging.INFO):
        return
    a = compiled.artefacts
    kernels = next(k for k in a if k.startswith("kernels."))  # kernels.cpp (C++) or kernels.py (Triton)
    names = ", ".join(a["kernel_names"]) or "none"
    source = a[kernels]
    if source.startswith(PRELUDE):  # the same helpers in every C++ source: named, not repeated per graph
        source = '#include "kiln/codegen/cpp/prelude.h"  // helpers with eager semantics\n' + source[len(PRELUDE):]
    log_output_code.info("output code for %s: kernels (%s) in %s\n%s", a["name"], names, kernels, source)
    log_output_code.info("output code for %s: wrapper.py\n%s", a["name"], a["wrapper.py"])


def _graph_name(gm: torch.fx.GraphModule) -> str:
    """`graph3/forward` for the forward graph of kiln's captured graph 3; `aten0` for a graph from elsewhere."""
    aot = gm.meta.get("kiln.aot", {})
    owner = aot.get("name", "")
    name = f"{owner}/{aot.get('kind', 'graph')}" if owner.startswith("graph") else f"aten{next(_graph_ids)}"
    _names_used[name] = _names_used.get(name, 0) + 1
    return name if _names_used[name] == 1 else f"{name}_{_names_used[name]}"


def _tensor_devices(gm: torch.fx.GraphModule, example_inputs: list) -> set[str]:
    """The device types of the graph's inputs and outputs, but for 0-d CPU tensors. A graph on CUDA tensors may
    take and return CPU tensors too (`torch.zeros(n)` made without a device and returned): the Triton target
    runs what eager computes on the CPU as ATen calls there (kiln/lower/host_work.py), 0-d CPU inputs and outputs
    cross to the graph's device and back (kiln/runtime/host_scalars.py)."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    for node in gm.graph.find_nodes(op="output"):
        for arg in pytree.tree_leaves(node.args):
            value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if isinstance(value, torch.Tensor):
                tensors.append(value)
    return {t.device.type for t in tensors if not is_host_scalar(t)}


def _is_inference(gm: torch.fx.GraphModule) -> bool:
    return gm.meta.get("kiln.aot", {}).get("kind") == "inference"


def _needs_decomposing(n: torch.fx.Node, fallback_random: bool) -> bool:
    """Does `n` decompose, or lack the traced value the code generator reads?"""
    if n.op != "call_function" or isinstance(n.meta.get("val"), (int, torch.SymInt)):
        return False
    return ("val" not in n.meta and not _item_of_traced(n)) or decomposes(n, fallback_random)


def _item_of_traced(node: torch.fx.Node) -> bool:
    """Whether `node` takes an item of a traced tuple: its value is known from the tuple's `meta['val']`. make_fx
    records no `val` for an item that is None (the bias gradient of `convolution_backward` for a convolution
    without bias), and such items alone must not re-trace a whole backward graph."""
    source = node.args[0] if node.target is operator.getitem and node.args else None
    return isinstance(source, torch.fx.Node) and isinstance(source.meta.get("val"), (tuple, list))


def _has_mutation(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _retrace(gm, example_inputs, fallback_random: bool):
    """Re-trace `gm` through kiln's decompositions so every node is core ATen with `meta['val']`."""
    table = decomposition_table(fallback_random)
    fake = [t for t in example_inputs if isinstance(t, torch._subclasses.FakeTensor)]
    if fake:
        with fake[0].fake_mode:
            return make_fx(gm, decomposition_table=table, tracing_mode="real")(*example_inputs)
    return make_fx(gm, decomposition_table=table, tracing_mode="fake")(*example_inputs)


__all__ = ["compile_aten_graph", "inductor", "CompiledGraph", "CompileOptions", "GRAPH_LISTENERS",
           "BACKEND_WRAPPERS", "ATEN_COMPILER_HOOKS", "STAGES", "Stages"]

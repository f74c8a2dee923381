"""`aot_compile`: a captured graph in, a callable running compiled ATen graphs out.

The passes, in order; each is timed, its graph kept in `AOTCompiled.traces` and
logged to `kiln.aot` as Python code:

    aliasing      inputs sharing storage, one written: views of one base input      (aliased_inputs.py)
    analyze       fake run of gm: output structure, aliases, which outputs need grad, (signature.py)
                  which inputs and outputs eager's backward saves                   (saved_versions.py)
    trace         ATen graph of the forward, or the joint forward+backward          (joint.py)
                  (an op's error while tracing: the graph runs op by op, raising as eager does;
                  a custom op's autograd formula reading tensor data: traced again with that
                  backward one opaque call of the formula                             (opaque_backward.py))
    functionalize pure ops; input mutations become outputs                           (functionalize.py)
    partition     min-cut split of the joint into forward and backward               (partition.py)
    (cached)      a variant traced before (by any process) takes its signature and graphs from the
                  compile cache instead of analyze, trace, functionalize, partition  (aot_cache.py)
    compile       the code generator's `compiler` on each graph
    runtime       autograd.Function / inference wrapper                              (runtime.py)

Which graphs are built depends on the call: when grad mode is on and some input
requires grad, the training pair for that requires-grad pattern; otherwise the
inference graph. Autocast active at the call is traced into the graphs (the
casts become graph ops), and the graphs then run with autocast off; where an
autocast region meets a training graph, which inputs eager's cast cache holds
(casts once, summing their uses' gradients in the low precision dtype) is part
of the variant too (autocast_cache.py). The variant
the example inputs ask for is compiled at once; others lazily, on the first call
that needs them.

RNG: random ops are traced as the ATen ops eager runs (`bernoulli`, ...), draw
from the global generator when the graph runs, and are never recomputed in the
backward (the partitioner bans them). Under `aot_eager` the ops run in eager's
order, so dropout masks equal eager's bit for bit for the same seed (tested; an
in-place draw into a tensor not laid out row-major draws into eager's layout: draws_in_place.py). A
code generator that lowers random ops itself gets eager's distribution, not
necessarily eager's stream.
"""
from __future__ import annotations

import functools
import logging
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from kiln import compiled_autograd, fallbacks
from kiln.autograd import aot_cache, autocast_cache
from kiln.autograd.absent_tangents import BackwardVariants
from kiln.autograd.aliased_inputs import AliasedInputsCompiled, written_alias_groups
from kiln.autograd.decompositions import tracing_table
from kiln.autograd.eager_errors import backward_error, eager_error
from kiln.autograd.functionalize import InputMutation, functionalize
from kiln.autograd.graph_parts import PartsCompiled, independent_parts
from kiln.autograd.joint import trace_forward, trace_joint
from kiln.autograd.opaque_backward import calls_custom_ops
from kiln.autograd.partition import JointLayout, Partition, partition
from kiln.autograd.runtime import InferenceRunner, TrainingRunner, boxed
from kiln.autograd.second_order import forward_to_rerun
from kiln.autograd.signature import FlatProgram, KilnLimit, NeedsStaticShapes, OutputAlias, TensorSpec
from kiln.runtime import collector, graph_cache, symbolic_sizes
from kiln.runtime.compile_lock import build_once, compile_lock
from kiln.runtime.graph_cache import Uncacheable

log = logging.getLogger("kiln.aot")
log_hints = logging.getLogger("kiln.perf_hints")

Compiler = Callable[[torch.fx.GraphModule, list], Callable]

_AUTOCAST_DEVICES = ("cpu", "cuda")
_requires_grad = operator.attrgetter("requires_grad")


def _writes_a_leaf_view(runner, flat: list) -> bool:
    """Does the call write, in place, an input that is a leaf that requires grad and views another tensor
    (`base[1:].requires_grad_()`)? Written (under no_grad, through any view of it), it bumps its base's version,
    and eager rebuilds the views of it taken before as views of the base, which requires no grad: what is computed
    from them after gives it no gradient (fuzz seed 450555: `t = c.t(); zeros_(c[:, :1]); return t + 1`). A
    compiled graph returns such a view taken after the write, with the leaf's history."""
    signature = getattr(runner, "signature", None)
    for i, _ in signature.mutated_grad_inputs if signature is not None else ():
        t = flat[i]
        if t.requires_grad and t.is_leaf and t._is_view():
            return True
    return False


def _int_or_requires_grad(value) -> bool:
    """A flat input that is an int (a SymInt where torch.compile passes its example inputs) requires no grad."""
    return isinstance(value, torch.Tensor) and value.requires_grad


class RaisesInEager(Exception):
    """Tracing a graph raised an error of one of its ops (the cause): eager raises it at run time."""


class CannotFunctionalize(Exception):
    """torch's functionalization failed on a traced graph (the cause: an internal assert of its own, on a write
    into an expanded view of an empty tensor, fuzz seed 481169): the graph runs op by op, a counted fallback."""


def _functionalized(*args):
    try:
        return functionalize(*args)
    except RuntimeError as e:
        raise CannotFunctionalize() from e


def aot_compile(gm: torch.fx.GraphModule, example_inputs: list, compiler: Compiler, *,
                decompositions: dict | Callable[[], dict] | None = None, name: str = "graph", cache: str | None = None
                ) -> Callable:
    """Compile `gm` (torch-level FX graph) through ATen graphs handed to `compiler`.

    `compiler(aten_gm, example_inputs)` receives the inference graph, or the forward and
    the backward graph separately (`aten_gm.meta["kiln.aot"]["kind"]` says which), with
    fake example inputs; it returns a callable over the same flat positional tensors (or,
    if it sets `_boxed_call = True`, over one list of them, which it may empty to free
    inputs early). The result has `gm`'s calling convention. A compiler that fuses ops into
    kernels says which with a `fuses(target) -> bool` attribute: the partitioner then prefers
    to save values that compiler stores anyway (`partition`'s `fused`); one that builds in the background says
    how to start with a `before_trace()` attribute, called before a variant is traced where the compiler will
    then build (not when its ATen graphs come from the cache, nor for a variant the cache cannot keep).

    `decompositions`: the table tracing applies, or a function making it (called only when a graph is traced).
    `cache`: the compiler's identity and options, as a string, to keep the ATen graphs in the compile cache
    under (aot_cache.py), or None to keep nothing (the compiler's output depends on more than it says).
    """
    split = independent_parts(gm, example_inputs, where_edges_differ=not gm.meta.get("kiln.ends_at_backward"))
    if split is not None:
        log.info("%s: compiling its %d independent parts as a backward node each", name, len(split.parts))
        return PartsCompiled(split, lambda part, inputs: aot_compile(part, inputs, compiler,
                                                                     decompositions=decompositions, name=name,
                                                                     cache=cache), example_inputs)
    if written_alias_groups(gm, example_inputs) != []:
        log.info("%s: inputs share storage and one is written: compiling with a base input per storage", name)
        return AliasedInputsCompiled(gm, example_inputs,
                                     lambda g, inputs: PerShapeCompiled(g, inputs, compiler, decompositions, name,
                                                                        cache), name)
    try:
        compiled = AOTCompiled(gm, example_inputs, compiler, decompositions, name, cache=cache)
        compiled.compile_for(example_inputs)
        return compiled
    except NeedsStaticShapes as e:
        log.info("%s: %s: compiling it once per input shape", name, e)
        return PerShapeCompiled(gm, example_inputs, compiler, decompositions, name, cache)


class PerShapeCompiled:
    """A dynamic-shape graph compiled once per distinct input shape, with static sizes.

    The fallback for what the symbolic path cannot express yet (`NeedsStaticShapes`), and
    for calls whose sizes fail a guard that the lazy compile of a second variant added:
    each new (shape, stride) signature gets its own static compilation (non-tensor inputs,
    baked in as constants, are part of the signature too).
    """

    def __init__(self, gm, example_inputs, compiler, decompositions, name, cache=None):
        self.args = (gm, compiler, decompositions, name, cache)
        self.compiled: dict[tuple, AOTCompiled] = {}
        self._for(example_inputs)

    def _for(self, args) -> AOTCompiled:
        key = tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else _constant_key(a) for a in args)
        return build_once(self.compiled, key, self._specialize, key, args)

    def _specialize(self, key: tuple, args) -> AOTCompiled:
        gm, compiler, decompositions, name, cache = self.args
        if self.compiled:
            log.info("%s: new input sizes %s: compiling specialization %d", name, key, len(self.compiled) + 1)
        compiled = AOTCompiled(gm, list(args), compiler, decompositions, name, static_shapes=True, cache=cache)
        compiled.compile_for(args)
        return compiled

    def __call__(self, *args):
        return self._for(args)(*args)

    @property
    def traces(self) -> dict:
        """Every specialization's passes (keys as AOTCompiled's, with the specialization's number appended)."""
        return {(*key, k): t for k, c in enumerate(self.compiled.values()) for key, t in c.traces.items()}

    @property
    def partitions(self) -> dict:
        return {(*key, k): p for k, c in enumerate(self.compiled.values()) for key, p in c.partitions.items()}


def _constant_key(value):
    try:
        hash(value)
        return ("constant", type(value), value)
    except TypeError:
        return ("object", id(value))


@dataclass
class Trace:
    """One pass's output: its name, how long it took, and the graph it produced."""

    name: str
    seconds: float
    graph: torch.fx.GraphModule | None


class AOTCompiled:
    """The callable `aot_compile` returns: one compiled runner per (requires-grad, autocast, cast cache) variant."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, compiler: Compiler,
                 decompositions: dict | Callable[[], dict] | None, name: str, static_shapes: bool = False,
                 cache: str | None = None):
        self.program = FlatProgram(gm, example_inputs, static_shapes)
        self.compiler = compiler
        self.cache = cache
        self.decompositions = decompositions
        self.name = name
        self.runners: dict[Any, Callable | None] = {}
        self.partitions: dict[Any, Partition] = {}
        self.traces: dict[Any, list[Trace]] = {}
        # Dynamic shapes. The variant compiled with the capture is covered by the capture's
        # guards (built after it); a variant compiled later may add size guards of its own:
        # they are checked here, and calls that fail them (or variants the symbolic path
        # cannot express: runner None) run a compilation specialized to their sizes.
        self.size_checks: dict[Any, str] = {}
        self.specialized: PerShapeCompiled | None = None
        self._covered_by_capture = True

    def __call__(self, *args):
        flat = self.program.flatten_inputs(args)
        key = self.key(flat, self.program)
        runner = self.runner(key)
        if runner is None or (self.size_checks and not self._sizes_admitted(key, flat)):
            return self._specialized(args)
        if key[0] is not None and _writes_a_leaf_view(runner, flat):
            return self._op_by_op(key, "it writes an input that is a view and a leaf that requires grad: eager's "
                                       "earlier views of it lose their history to its base, as a compiled graph's "
                                       "cannot")(flat)
        return runner(flat)

    def _sizes_admitted(self, key, flat: list) -> bool:
        check = self.size_checks.get(key)
        return check is None or self.program.shape_env().evaluate_guards_expression(check, flat)

    def _specialized(self, args: tuple):
        if self.specialized is None:
            with compile_lock:
                if self.specialized is None:
                    self.specialized = PerShapeCompiled(self.program.gm, list(args), self.compiler,
                                                        self.decompositions, self.name, self.cache)
        return self.specialized(*args)

    def compile_for(self, args) -> None:
        """Compile now the variant that a call with `args` runs (the rest compile on first use)."""
        self.runner(self.key(self.program.flatten_inputs(tuple(args)), self.program))

    @staticmethod
    def key(flat: list, program: FlatProgram) -> tuple:
        """(None for inference, else which flat inputs require grad; the autocast state; for training where an
        autocast region meets the graph, eager's autocast cache at the call (autocast_cache.py), else None)."""
        autocast = ()
        if torch._C._is_any_autocast_enabled():
            autocast = tuple((d, torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES
                             if torch.is_autocast_enabled(d))
        requires_grad = _int_or_requires_grad if program.has_int_inputs else _requires_grad
        if not torch.is_grad_enabled() or not any(map(requires_grad, flat)):
            return None, autocast, None
        cast_cache = autocast_cache.variant(flat, bool(autocast), program.enters_autocast)
        return tuple(map(requires_grad, flat)), autocast, cast_cache

    def runner(self, key: tuple) -> Callable | None:
        """The variant for `key`; compiled on its first call, by one thread (calls come from many)."""
        try:
            return self.runners[key]  # every call: no lock
        except KeyError:
            return build_once(self.runners, key, self._build_runner, key)

    def _build_runner(self, key: tuple) -> Callable | None:
        start = time.perf_counter()
        self.traces[key] = []
        covered = self._covered_by_capture  # compiled within the capture's backend call
        shape_env = self.program.shape_env()
        guards_before = len(shape_env.guards) if shape_env else 0
        try:
            runner = self._build_training(key) if key[0] is not None else self._build_inference(key)
        except NeedsStaticShapes as e:
            if covered:
                raise
            log.info("%s: %s: this variant compiles once per input shape", self.name, e)
            runner = None
        except (DynamicOutputShapeException, DataDependentOutputException) as e:
            runner = self._data_dependent_fallback(key, e)
        except RaisesInEager as e:
            runner = self._checked_by_eager(key, e.__cause__)
        except CannotFunctionalize as e:
            runner = self._op_by_op(key, f"torch's functionalization failed ({type(e.__cause__).__name__}: "
                                         f"{str(e.__cause__).splitlines()[0][:200]})")
        except KilnLimit as e:  # not torch's NotImplementedError (a sparse tensor's storage): that fails the backend
            runner = self._op_by_op(key, str(e).splitlines()[0][:300])
        finally:
            if covered:
                self._covered_by_capture = False
        if shape_env and not covered and len(shape_env.guards) > guards_before:
            self.size_checks[key] = shape_env.produce_guards_expression(self.program.symbolic_inputs())
        log.info("%s: compiled %s in %.2f s (%s)", self.name, "training" if key[0] else "inference",
                 time.perf_counter() - start, ", ".join(f"{t.name} {t.seconds:.3f}s" for t in self.traces[key]))
        return runner

    def _data_dependent_fallback(self, key: tuple, error: Exception) -> Callable:
        """A variant whose ATen graphs would need a data-dependent size (capture keeps `y[mask] = v` in the
        graph, as torch.compile does, but its backward indexes by the mask): the captured graph runs op
        by op, with eager's autograd. Correct, not compiled: a fallback (kiln.fallbacks)."""
        return self._op_by_op(key, f"needs a size or value that depends on tensor data ({type(error).__name__}: "
                                   f"{error})")

    def _op_by_op(self, key: tuple, why: str) -> Callable:
        """The captured graph run op by op for variant `key`, a fallback (kiln.fallbacks) saying `why`."""
        fallbacks.record("graph", f"{self.name}/{'training' if key[0] else 'inference'}",
                         f"{why}; the captured graph runs op by op", stage="autograd")
        return self.program.run

    def _trace(self, key: tuple, name: str, fn: Callable, *args, graph_of: Callable) -> Any:
        """A pass running the program's ops on fake tensors (`analyze`, `trace`); an error of one of them (raised
        by its fake kernel or by the autograd engine while tracing the backward) becomes `RaisesInEager`. A
        fake kernel may refuse what eager's runs (`d[...] = d` into an expanded `d`, with symbolic sizes):
        either way the graph then runs op by op, which does what eager does."""
        try:
            return self._pass(key, name, fn, *args, graph_of=graph_of)
        except (NotImplementedError, DynamicOutputShapeException, DataDependentOutputException, RecursionError):
            # kiln's own limits, and data-dependent sizes, have their own handling; Python's stack running out is
            # a failure of kiln's tracing (a cycle of decompositions), never an op's check that eager makes too
            raise
        except ZeroDivisionError as e:
            # size arithmetic at these sizes divides by zero in Python (a variance's backward over as many
            # elements as its correction: `2 / (n - 1)` at n = 1), where eager's C++ gives inf: static sizes do too
            raise NeedsStaticShapes(f"sizes divided by zero ({e})") from e
        except RuntimeError as e:
            raise RaisesInEager() from e

    def _checked_by_eager(self, key: tuple, error: RuntimeError) -> Callable:
        """A variant whose tracing raised: an op's check failed on the traced sizes, dtypes or strides (a
        write into an expanded tensor, in the forward or in the backward autograd runs for it; a value saved
        for the backward written in place later). Eager raises there too, at run time: in the forward, or in
        the backward once the forward has run. The captured graph runs op by op so that it raises as eager
        does, where eager does; logged as a slow path."""
        log_hints.warning("%s: tracing the %s graph raised (%s: %s); it runs eagerly, op by op, to raise as "
                          "eager does", self.name, "training" if key[0] else "inference", type(error).__name__,
                          str(error).split(" Hint:")[0])  # the hint is about anomaly detection, not kiln
        return self.program.run

    def _integer_requires_grad(self, signature) -> bool:
        """Does the graph leave an integer tensor requiring grad (written in place with a value that requires
        grad: `int_t[...] = x`)? Eager lets such a tensor exist, and raises only when autograd is asked to go
        through it (a view of it, a backward); no graph can return it (autograd has no gradient of an integer
        dtype), so the graph runs op by op, as eager's does; logged as a slow path."""
        integer = [spec.dtype for spec, grad in zip(signature.graph_outputs, signature.requires_grad)
                   if grad and not (spec.dtype.is_floating_point or spec.dtype.is_complex)]
        if integer:
            log_hints.warning("%s: the graph leaves a tensor of dtype %s requiring grad; it runs eagerly, op by op",
                              self.name, integer[0])
        return bool(integer)

    def _raises_in_eager(self, traced: torch.fx.GraphModule, joint: bool = False) -> bool:
        """Does `traced` hold an op whose eager error the compiled graphs would lose (`eager_error`, and for
        a joint graph `backward_error`)? Such a graph runs the captured graph op by op, which raises what
        eager raises; logged as a slow path."""
        reason = eager_error(traced) or (backward_error(traced) if joint else None)
        if reason is not None:
            log_hints.warning("%s: the graph has %s; it runs eagerly, op by op, to raise as eager does",
                              self.name, reason)
        return reason is not None

    def _pass(self, key: tuple, name: str, fn: Callable, *args, graph_of: Callable | None = None):
        """Run one named pass, timing it and keeping (and logging) the graph it produced."""
        start = time.perf_counter()
        result = fn(*args)
        self._record(key, name, time.perf_counter() - start, graph_of(result) if graph_of else None)
        return result

    def _record(self, key: tuple, name: str, seconds: float, graph: torch.fx.GraphModule | None) -> None:
        self.traces[key].append(Trace(name, seconds, graph))
        if graph is not None and log.isEnabledFor(logging.INFO):
            log.info("%s %s graph:\n%s", self.name, name, graph.print_readable(print_output=False))

    def _cached(self, key: tuple, kind: str) -> tuple[str | None, tuple | None]:
        """(the product key of variant `key`, or None if it cannot be cached; what the compile cache keeps of it,
        decoded, or None: the output signature, and the ATen graphs with what the runtime needs of them). A product
        that does not decode is removed (and compiled again), with one warning."""
        if self.cache is None:
            return None, None
        try:
            product_key = aot_cache.variant_key(self.program, key, self.cache)
        except Uncacheable as e:
            log.debug("%s: not cached: %s", self.name, e)
            aot_cache.stats["uncacheable"] += 1
            return None, None
        start = time.perf_counter()
        product = graph_cache.lookup(product_key, aot_cache.FOLDER)
        if product is None:
            return product_key, None
        try:
            signature, graphs, mutations = aot_cache.decode_graphs(product, kind, self.program.fake_mode())
            if kind == "inference":
                decoded = signature, graphs, mutations
            else:
                split = self.partitions[key] = aot_cache.decode_partition(product, graphs)
                decoded = (signature, split, mutations, int(product["num_outputs"]),
                           [bool(g) for g in product["grad_mask"]])
        except symbolic_sizes.GuardsDoNotHold as e:  # traced for other sizes: traced again for these
            log.info("%s: the cached %s graphs are for other sizes (%s); tracing again", self.name, kind, e)
            return product_key, None
        except (ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:
            log.warning("kiln: %s: the cached %s graphs could not be used (%s: %s); tracing again", self.name, kind,
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            graph_cache.forget(product_key, aot_cache.FOLDER)
            return product_key, None
        aot_cache.stats["hits"] += 1
        self._record(key, "from the compile cache", time.perf_counter() - start, None)
        return product_key, decoded

    def _before_trace(self, product_key: str | None) -> None:
        """Tell the compiler that a variant is about to be traced because the cache has no ATen graphs for it, or
        nothing is cached: one that builds in the background (`before_trace`, kiln's Triton build workers) starts
        now, during the trace. Not for a variant the cache cannot keep while caching is on: its ATen graphs are
        traced every time, but the compiler's products of them may well be cached."""
        aot_cache.stats["traces"] += 1
        collector.resume()
        start = getattr(self.compiler, "before_trace", None)
        if start is not None and (product_key is not None or self.cache is None):
            start()

    def _guard_count(self) -> int:
        shape_env = self.program.shape_env()
        return len(shape_env.guards) if shape_env is not None else 0

    def _store(self, product_key: str | None, guards: int, encode: Callable, *parts) -> None:
        """Keep the variant's ATen graphs in the compile cache (when it has a key and they can be described),
        with the size guards its trace added after the first `guards` (a process loading it adds them)."""
        if product_key is None:
            return
        try:
            product = encode(*parts)
            product["shape_guards"] = symbolic_sizes.guards_since(self.program.shape_env(), guards)
        except Uncacheable as e:
            log.debug("%s: not cached: %s", self.name, e)
            aot_cache.stats["uncacheable"] += 1
            return
        graph_cache.store(product_key, product, aot_cache.FOLDER)

    def _compile(self, key: tuple, kind: str, graph: torch.fx.GraphModule, visible_outputs: int | None = None,
                 mutations: list[InputMutation] = (), input_strides: dict[int, tuple] | None = None,
                 alias_bases: tuple[int, ...] = (), unversioned: tuple[int, ...] = ()) -> Callable:
        """`graph` through the compiler, told its kind, (a forward's) how many outputs the caller sees (the
        rest are saved for the backward) and (an inference graph's) which outputs are new values of its inputs:
        the compiler may write them into the inputs, moving their version counters, which the runtime then finds
        written; not those of `unversioned` (inputs eager writes without moving their counters). `input_strides`
        (placeholder index -> strides): inputs the graph receives with other strides than it was traced with
        (a backward's activations, saved channels-last by the compiled forward). `alias_bases`: the outputs
        other outputs are rebuilt on as views at their traced geometry (signature.py `OutputAlias`): the
        compiler must return those with their traced strides."""
        graph.meta["kiln.aot"] = {"kind": kind, "name": self.name}
        if visible_outputs is not None:
            graph.meta["kiln.aot"]["visible_outputs"] = visible_outputs
        if mutations:  # what eager writes where no version counter sees it is copied in by the runtime alone
            graph.meta["kiln.aot"]["input_writes"] = tuple((m.output_index, m.input_index) for m in mutations
                                                           if m.input_index not in unversioned)
        if alias_bases:
            graph.meta["kiln.aot"]["alias_bases"] = alias_bases
        example_inputs = [n.meta["val"] for n in graph.graph.find_nodes(op="placeholder")]
        if input_strides:
            example_inputs = restrided_examples(graph, example_inputs, input_strides, self.program.fake_mode())
        return self._pass(key, f"compile {kind}", self.compiler, graph, example_inputs)

    def _build_inference(self, key: tuple) -> Callable:
        program = self.program
        product_key, cached = self._cached(key, "inference")
        if cached is not None:
            signature, graphs, mutations = cached
            compiled = self._compile(key, "inference", graphs["inference"], mutations=mutations,
                                     alias_bases=_alias_bases(signature), unversioned=signature.unversioned_inputs)
            return InferenceRunner(program, signature, compiled, mutations)
        self._before_trace(product_key)
        guards = self._guard_count()
        signature = self._trace(key, "analyze", program.analyze, None, graph_of=None)
        return self._inference_for(key, signature,
                                   lambda graph, mutations: self._store(product_key, guards, aot_cache.encode_inference,
                                                                        signature, graph, mutations))

    def _inference_for(self, key: tuple, signature, store: Callable = lambda graph, mutations: None) -> Callable:
        """The forward-only graph computing `signature`'s graph outputs, traced, functionalized and compiled;
        `store(graph, mutations)` keeps it in the compile cache."""
        program = self.program
        traced = self._trace(key, "trace", trace_forward, program.graph_function(signature), program.input_specs,
                             tracing_table(self.decompositions, training=False), program.fake_mode(),
                             graph_of=lambda gm: gm)
        if self._raises_in_eager(traced):
            return self.program.run
        graph, mutations = self._pass(key, "inference", _functionalized, traced, program.input_specs,
                                      program.fake_mode(), len(signature.graph_outputs),
                                      graph_of=lambda result: result[0])
        store(graph, mutations)
        compiled = self._compile(key, "inference", graph, mutations=mutations, alias_bases=_alias_bases(signature),
                                 unversioned=signature.unversioned_inputs)
        return InferenceRunner(program, signature, compiled, mutations)

    def _build_training(self, key: tuple) -> Callable:
        program = self.program
        requires_grad = key[0]
        product_key, cached = self._cached(key, "training")
        if cached is not None:
            return self._training_runner(key, *cached)
        self._before_trace(product_key)
        guards = self._guard_count()
        signature = self._trace(key, "analyze", program.analyze, requires_grad, graph_of=None)
        if self._integer_requires_grad(signature):
            return self.program.run
        if not signature.differentiable():  # nothing to differentiate: the inference graph serves, with
            # this signature's aliases (a view of an input that requires grad keeps its history), where it computes
            # the same graph outputs: analyzed in grad mode, an output may be a graph output of its own where the
            # inference graph returns its base and rebuilds it as a view (a transposed intermediate: fuzz 431840)
            inference = self.runner((None, key[1], None))
            if not isinstance(inference, InferenceRunner):
                return inference
            if _assembled_from(inference.signature) == _assembled_from(signature):
                return inference.with_signature(signature)
            return self._inference_for(key, signature)
        joint = self._trace_joint(key, signature)
        if self._raises_in_eager(joint.gm, joint=True):
            return self.program.run
        graph, mutations = self._pass(key, "joint", _functionalized, joint.gm,
                                      program.input_specs + signature.tangent_specs(), program.fake_mode(),
                                      joint.num_outputs, graph_of=lambda result: result[0])
        _check_no_mutation_of_grad_inputs(mutations, requires_grad, signature.unversioned_inputs)
        num_outputs, num_grads = joint.num_outputs, sum(joint.grad_mask)
        layout = JointLayout(
            num_primals=joint.num_primals,
            forward_outputs=list(range(num_outputs)) + [m.output_index for m in mutations],
            backward_outputs=list(range(num_outputs, num_outputs + num_grads)),
            grad_primals=_held_primals(joint.grad_mask, signature, mutations),
            exposed_primals=_exposed_primals(program, signature, mutations),
            exposed_outputs=_returned_outputs(signature, saved_by_eager=False),
            outputs_saved_by_eager=_returned_outputs(signature, saved_by_eager=True))
        split = self.partitions[key] = self._pass(key, "partition", partition, graph, layout, "min_cut",
                                                 getattr(self.compiler, "fuses", None))
        log.info("%s partition, %s", self.name, split.summary())
        self._store(product_key, guards, aot_cache.encode_training, signature, split, mutations, num_outputs,
                    joint.grad_mask)
        return self._training_runner(key, signature, split, mutations, num_outputs, joint.grad_mask)

    def _trace_joint(self, key: tuple, signature):
        """The joint graph; where tracing needs a value of tensor data, traced again with each custom op's
        backward as one call of its registered formula (opaque_backward.py: a formula that reads tensor data,
        transformers' grouped matmul of mixture-of-experts layers). If that needs one too, the error stands."""
        program = self.program
        trace = functools.partial(self._trace, key)
        graph_function = functools.partial(program.graph_function, signature, at_views=signature.gradients_at_views)
        args = (trace_joint, graph_function, program.input_specs, key[0], signature,
                tracing_table(self.decompositions, training=True), program.fake_mode(), key[2])
        try:
            return trace("trace joint", *args, graph_of=lambda j: j.gm)
        except DataDependentOutputException as e:
            if not calls_custom_ops(program.gm):
                raise
            log.info("%s: tracing the joint graph needs tensor data (%s); tracing it again with custom ops' "
                     "backward opaque", self.name, e)
        return trace("trace joint, custom ops' backward opaque", *args, True, graph_of=lambda j: j.gm)

    def _training_runner(self, key: tuple, signature, split: Partition, mutations: list[InputMutation],
                         num_outputs: int, grad_mask: list[bool]) -> TrainingRunner:
        """The forward and backward graphs of `split` compiled, behind one autograd.Function."""
        program = self.program
        self._record(key, "forward", 0.0, split.forward)
        self._record(key, "backward", 0.0, split.backward)
        forward = self._compile(key, "forward", split.forward, visible_outputs=num_outputs + len(mutations),
                                alias_bases=_alias_bases(signature))
        saved_strides = _saved_strides(forward, split)
        backward = BackwardVariants(split.backward, len(signature.tangent_specs()),
                                    lambda graph: boxed(self._compile(key, "backward", graph,
                                                                      input_strides=saved_strides)),
                                    lazy=compiled_autograd.is_active())
        # The forward graph returns the outputs, then the mutated inputs' new values, then the saved tensors.
        moved = [InputMutation(m.input_index, num_outputs + k) for k, m in enumerate(mutations)]
        written = _written_inputs(signature, mutations)
        snapshots = [i is not None and i in written for i in split.saved_inputs]
        # an input the runtime writes after the forward is watched from the version those writes leave it at
        watched = signature.saved_by_eager
        # saved values on the storage of a watched tensor: eager's version check is the watch's, which raises only
        # where a gradient reaches what eager saved; autograd's would raise at any backward through the graph
        watched_inputs = {w.index for w in watched if w.of_input}
        watched_outputs = {w.index for w in watched if not w.of_input}
        watch_only = [i in watched_inputs or j in watched_outputs
                      for i, j in zip(split.saved_inputs, split.saved_outputs)]
        # an output eager saves, saved as returned: the returned tensor itself (a code generator may write a value
        # it returns twice into two buffers, and the backward must read what the caller wrote into the output)
        forward_outputs = list(next(iter(split.forward.graph.find_nodes(op="output"))).args[0])
        returned = forward_outputs[:num_outputs]
        saved_returned = [(k, returned.index(node)) for k, node in enumerate(forward_outputs[len(forward_outputs)
                                                                                               - len(split.saved):])
                          if watch_only[k] and split.saved_outputs[k] is not None and node in returned]
        primals = {n.name: k for k, n in enumerate(split.forward.graph.find_nodes(op="placeholder"))}
        saved_primals = [primals.get(name) for name in split.saved]
        unreached = [i for i, (rg, grad) in enumerate(zip(key[0], grad_mask)) if rg and not grad]
        if len(unreached) == sum(map(bool, key[0])):  # a differentiable output whose formulas give no input a
            unreached = []  # gradient (vector_norm of order 0): eager's node keeps its edges, its output grad_fn
        return TrainingRunner(program, signature, forward, backward, moved, split.saved_is_size, grad_mask,
                              snapshots, watched, watch_only, saved_returned, saved_primals, unreached,
                              graph_origin(program.gm),
                              forward_to_rerun(split.forward, saved_primals, split.saved_is_size),
                              _computed_as_views(returned))


def _computed_as_views(returned: list) -> tuple[int, ...]:
    """The positions of the forward graph's returned values that are views of its own values: a view op's
    result, or an element of one's (`split`, `unbind`). The runtime returns them detached (runtime.py)."""
    def is_view(node) -> bool:
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return False
        if node.target is operator.getitem:
            return is_view(node.args[0])
        return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view
    return tuple(k for k, node in enumerate(returned) if is_view(node))


def graph_origin(gm: torch.fx.GraphModule) -> str:
    """Where the user's code that `gm` holds is (the capture's `frame` and `kiln.ends_at` meta), for errors the
    compiled graph raises at run time; the graph's name where it was not captured by kiln."""
    meta = gm.meta if isinstance(getattr(gm, "meta", None), dict) else {}
    origin = meta.get("frame", "")
    if "kiln.ends_at" in meta:
        origin += f", ending at the graph break at {meta['kiln.ends_at']}"
    return origin or type(gm).__name__


def _assembled_from(signature) -> list:
    """The graph outputs the function's results are assembled from (those before the inputs written in place),
    each with the result it is (`graph_sources`: a leaf, or that leaf's base). The layout alone does not tell
    them apart: a negated view and its base share one (`(-t)._neg_view()`), and an inference graph returning
    the base where this signature wants the view would hand back the memory's values, negated (fuzz 704804)."""
    return list(zip(signature.graph_outputs, signature.graph_sources))


def _alias_bases(signature) -> tuple[int, ...]:
    """The graph outputs that other outputs are rebuilt on as views (`OutputAlias`), in order."""
    return tuple(sorted({leaf.output_index for leaf in signature.leaves if isinstance(leaf, OutputAlias)}))


def _saved_strides(forward: Callable, split: Partition) -> dict[int, tuple]:
    """Backward placeholder index -> strides, for the saved values the compiled forward returns in another
    layout than the traced one (`restrided_outputs` of kiln's compiled graphs; other compilers return the
    traced layouts). The forward returns its saved values last, the backward takes them first."""
    restrided = getattr(forward, "restrided_outputs", ())
    if not restrided:
        return {}
    outputs = len(torch.utils._pytree.tree_flatten(next(iter(split.forward.graph.find_nodes(op="output"))).args[0])[0])
    first_saved = outputs - len(split.saved)
    return {k - first_saved: stride for k, stride in restrided if k >= first_saved}


def restrided_examples(graph: torch.fx.GraphModule, examples: list, strides: dict[int, tuple], fake_mode) -> list:
    """`examples` with the inputs in `strides` given those strides (and `graph`'s placeholders, whose values
    the code generator reads), and `graph`'s views made reshapes: a view traced on an input in one layout may
    not be one of the same input in another (an eager fallback of the graph, or a re-trace, runs on these
    inputs)."""
    out = list(examples)
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    for k, stride in strides.items():
        t = examples[k]
        with getattr(t, "fake_mode", None) or fake_mode:
            out[k] = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
        placeholders[k].meta["val"] = out[k]
    for view in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default):
        for node in graph.graph.find_nodes(op="call_function", target=view):
            node.target = torch.ops.aten.reshape.default
    graph.recompile()
    return out


def _held_primals(grad_mask: list[bool], signature, mutations: list[InputMutation]) -> tuple[bool, ...]:
    """Per primal: requires grad and is not written after the graph (so saving it, rather than a value
    computed from it, keeps nothing alive that its owner does not, and autograd's version check holds)."""
    written = _written_inputs(signature, mutations)
    return tuple(grad and i not in written for i, grad in enumerate(grad_mask))


def _exposed_primals(program: FlatProgram, signature, mutations: list[InputMutation]) -> tuple[bool, ...]:
    """Per primal: a tensor the caller may write in place between the forward and the backward, which eager's
    backward does not read: not a parameter (held by its module, written in place by an optimizer's step, after
    the backward), not saved by eager's autograd (whose version check would then raise in eager too), not written
    by the graph (the runtime saves a copy of such an input). A leaf that requires grad is exposed too: eager
    refuses an in-place write to it under grad mode, but not under `no_grad` (`nn.init.zeros_`) nor through a
    detached alias (`x.detach()[:2]`, which shares its version counter). Saved by the partition to recompute a
    value from, the backward would find it written (`x.add_(1)` after `exp(x + w)`, where eager saved the exp):
    the partition saves what is computed from it instead (`JointLayout`)."""
    saved_by_eager = {w.index for w in signature.saved_by_eager if w.of_input}
    written = _written_inputs(signature, mutations)
    return tuple(isinstance(spec, TensorSpec) and not parameter and i not in saved_by_eager and i not in written
                 for i, (spec, parameter) in enumerate(zip(program.input_specs, program.parameters)))


def _returned_outputs(signature, saved_by_eager: bool) -> tuple[int, ...]:
    """The graph outputs the caller receives (or views of them; not the new values of inputs, which the runtime
    copies into them) whose storage eager's backward reads (`saved_by_eager`), or reads none of: the partition
    reads the first as returned, and saves the others only where it must (`JointLayout`)."""
    new_values = {j for _, j in signature.mutated_grad_inputs}
    saved = {w.index for w in signature.saved_by_eager if not w.of_input}
    return tuple(j for j in range(len(signature.graph_outputs))
                 if j not in new_values and (j in saved) == saved_by_eager)


def _written_inputs(signature, mutations: list[InputMutation]) -> set[int]:
    """The flat inputs the runtime writes after the forward graph ran: their data, or their geometry."""
    return ({i for i, _ in signature.mutated_grad_inputs} | {m.input_index for m in mutations}
            | {i for i, _ in signature.restrided_inputs})


def _check_no_mutation_of_grad_inputs(mutations: list[InputMutation], requires_grad: tuple[bool, ...],
                                      unversioned: tuple[int, ...]) -> None:
    """Inputs that require grad are mutated on clones (signature.mutated_grad_inputs), never in the graph, unless
    the write is one autograd does not see (through `.data`: `unversioned`)."""
    for m in mutations:
        if requires_grad[m.input_index] and m.input_index not in unversioned:
            raise AssertionError(f"kiln: input {m.input_index} requires grad but the graph mutates it in place")


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The `"aot_eager"` backend: ATen forward and backward graphs run op by op.

    Everything kiln's autograd stage does (tracing, functionalization, partition,
    runtime) and nothing of the code generator: it tells a bug of this stage from
    one of codegen.
    """
    return aot_compile(gm, example_inputs, run_graph, name="aot_eager")


def run_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run `gm` node by node, freeing each value (inputs included) after its last use.

    A fresh Interpreter per call: one kept across calls would hold the last call's
    outputs (the saved activations among them) in its environment until the next call.
    """

    def run(args: list):
        return torch.fx.Interpreter(gm).boxed_run(args)

    run._boxed_call = True
    return run

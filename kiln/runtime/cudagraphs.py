"""CUDA graphs: `mode="reduce-overhead"` (option `triton.cudagraphs`) and the `"cudagraphs"` backend.

A compiled ATen graph (a callable over flat CUDA tensors: the inference graph, or the
forward and the backward graph of a training pair) is wrapped in `CUDAGraphed`. The
first call with an input signature runs it as it is (the warm-up: kernels compile,
cuBLAS sets up); the second records it into a `torch.cuda.CUDAGraph`; later calls
replay the recording.

Inputs. Parameters, and outputs of another graph of the same pool (the activations and
weights a backward graph reads from its forward's replay), are read where they are: the
recording bakes their addresses in, and a call where one sits elsewhere needs another
recording (one graph per signature, at most `MAX_RECORDINGS` per compiled graph).
Every other input is copied into a static buffer of the recording, and only when its
address differs from that buffer's.

Pool. All graphs of one compiled model (inference, forward, backward, every signature)
allocate from one private memory pool (`torch.cuda.graph_pool_handle`).

Outputs and staleness. A replay returns the recording's static output tensors, as fresh
aliases (`detach()`: same memory, a tensor object of its own). Replaying a recording
writes its outputs and its intermediates where it did before, and a graph recorded
later in the same pool may have placed its outputs in an earlier graph's freed
intermediates; so replaying the pool's k-th recording overwrites the outputs returned
by recordings k, k+1, ... Those aliases are invalidated at that moment (each recording
counts its replays: the generation an output belongs to): reading one, or passing it
to a compiled graph, raises an error naming the graph that overwrote it rather than
giving its new contents. The rule, for users: an output of a `reduce-overhead` model
is valid until the next call of the model (in training: until the next forward — the
backward replay leaves the forward's outputs alone); `.clone()` what you keep longer.
Views taken of an output before it went stale are not caught. A saved input (the
recording's input buffer, refilled by the next forward) trips autograd's version check
instead: both are errors, neither a wrong gradient.
`kiln.cudagraph_mark_step_begin()` (torch.compiler.cudagraph_mark_step_begin) ends a
step explicitly: every output returned so far is invalidated at once. kiln does not
need it (outputs go stale exactly when overwritten); code written for torch may call it.

Gradients. The recording keeps a reference to each alias it returns until it is
invalidated, so autograd's AccumulateGrad copies a gradient into `.grad` instead of
adopting memory of the pool that the next replay overwrites.

Fallbacks (no graphs, one `kiln.perf_hints` line saying why): CPU tensors or several
devices, dynamic shapes (a graph captured with symbolic sizes), graphs that mutate
their inputs in place, ops that synchronize with the host (`.item()`, `nonzero`,
boolean-mask indexing: a table, checked before recording), and anything else whose
capture raises; then that graph runs as it is from then on. kiln's ATen graphs are functional: input
mutations (BatchNorm's running statistics) are graph outputs written back after the
call, so such graphs are recorded; the write-back runs outside the graph.
"""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("kiln.perf_hints")

MAX_RECORDINGS = 8
"""Recordings (input signatures) per compiled graph; past it, new signatures run without graphs."""

_set_stale = getattr(torch._C, "_set_storage_access_error_msg", None)  # CUDA builds of torch have it
_pools: weakref.WeakSet[CUDAGraphPool] = weakref.WeakSet()


def cudagraph_mark_step_begin() -> None:
    """Start a new step: every output of a CUDA-graph replay returned so far becomes invalid now."""
    for pool in list(_pools):
        pool.invalidate_from(0, "kiln.cudagraph_mark_step_begin()")


class CUDAGraphError(RuntimeError):
    """A stale output of a CUDA-graph replay was used (only raised where torch cannot mark tensors stale)."""


def _stale_message(owner: str, by: str) -> str:
    return (f"kiln: this tensor is an output of {owner}, replayed from a CUDA graph (mode='reduce-overhead' or "
            f"backend='cudagraphs'), and was overwritten by {by}. An output is valid until the next call of "
            f"the compiled model; clone it (out.clone()) to keep it longer.")


def _invalidate(t: torch.Tensor, message: str) -> None:
    if _set_stale is not None:
        _set_stale(t, message)
    else:  # torch without the storage hook (CPU builds): passing it to a compiled graph still raises
        t._kiln_stale = message


class CUDAOps:
    """Recording and replaying on the GPU; tests swap in an object with the same methods."""

    def new_pool(self, device: torch.device):
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def capture(self, call: Callable, inputs: list, pool, device: torch.device):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream()
            try:
                with torch.cuda.graph(graph, pool=pool):
                    outs = call(list(inputs))
            except Exception:
                # a failed capture_end leaves torch.cuda.graph's side stream current: put the caller's back
                torch.cuda.set_stream(stream)
                torch.cuda.synchronize()
                raise
        return graph, outs

    def replay(self, graph) -> None:
        graph.replay()


class CUDAGraphPool:
    """The graphs of one compiled model and the private memory pool they share."""

    def __init__(self, name: str, ops: Any = None):
        self.name = name
        self.ops = ops or CUDAOps()
        self.handle = None                    # the memory pool, created with the first recording
        self.recordings: list[Recording] = []  # in recording order
        self.owners: dict[int, CUDAGraphed | str] = {}  # address of a static output -> its graph (or _PARAMETER)
        self.graphs: list[CUDAGraphed] = []
        _pools.add(self)

    @classmethod
    def for_graph(cls, gm: torch.fx.GraphModule, example_inputs: list, name: str) -> CUDAGraphPool | None:
        """A pool for the ATen graphs of captured graph `gm`, or None (and a log line) if graphs cannot apply."""
        reason = _captured_reason(gm, example_inputs)
        if reason:
            log.info("%s: CUDA graphs off: %s", name, reason)
            return None
        return cls(name)

    def wrap(self, compiled: Callable, aten_gm: torch.fx.GraphModule | None, example_inputs: list) -> Callable:
        """`compiled` recorded into CUDA graphs, or `compiled` itself (and a log line) if it cannot be."""
        kind = (aten_gm.meta.get("kiln.aot", {}).get("kind") if aten_gm is not None else None) or "graph"
        name = f"{self.name}/{kind}"
        reason, device = _aten_reason(aten_gm, example_inputs)
        if reason:
            log.info("%s: CUDA graphs off: %s", name, reason)
            return compiled
        graphed = CUDAGraphed(compiled, self, name, device)
        self.graphs.append(graphed)
        return graphed

    def invalidate_from(self, order: int, by: str) -> None:
        """Outputs of the recordings from `order` on are about to be overwritten: make them stale."""
        for rec in self.recordings[order:]:
            if rec.outstanding:
                message = _stale_message(f"{rec.name} (replay {rec.replays})", by)
                for t in rec.outstanding:
                    _invalidate(t, message)
                rec.outstanding = ()


def _captured_reason(gm: torch.fx.GraphModule, example_inputs: list) -> str | None:
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape):
            return "dynamic shapes (the graph was captured with symbolic sizes)"
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if devices - {"cuda"}:
        return f"inputs on {', '.join(sorted(devices))} (CUDA graphs record CUDA work only)"
    return None


# ATen ops that wait for the GPU (their result or its size is read on the host): a capture would fail.
_SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_consecutive",
            "aten::_unique2", "aten::unique_dim", "aten::repeat_interleave",
            "aten::equal", "aten::is_nonzero"}


def _aten_reason(gm: torch.fx.GraphModule | None, example_inputs: list) -> tuple[str | None, torch.device | None]:
    values = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if gm is not None:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                schema = getattr(node.target, "_schema", None)
                if schema is not None and schema.is_mutable:
                    return f"it mutates tensors in place ({node.target})", None
                if schema is not None and schema.name in _SYNCING:
                    return f"{node.target} synchronizes with the host", None
                if schema is not None and schema.name == "aten::index" and any(
                        isinstance(i, torch.fx.Node) and getattr(i.meta.get("val"), "dtype", None) == torch.bool
                        for i in (node.args[1] if len(node.args) > 1 else [])):
                    return f"{node.target} with a boolean mask synchronizes with the host", None
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                values.append(val)
    if any(isinstance(s, torch.SymInt) for t in values for s in t.shape):
        return "dynamic shapes (symbolic sizes in the graph)", None
    devices = {t.device for t in values}
    if not devices:
        return "no tensors", None
    if any(d.type != "cuda" for d in devices):
        return f"tensors on {', '.join(sorted({d.type for d in devices}))} (CUDA graphs record CUDA work only)", None
    if len(devices) > 1:
        return f"tensors on several devices ({', '.join(sorted(map(str, devices)))})", None
    if not torch.cuda.is_available():
        return "CUDA is not available", None
    device = next(iter(devices))
    return None, torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())


def _overlapping(t: torch.Tensor) -> bool:
    """True unless `t`'s elements provably sit at distinct addresses (then a strided copy into it is safe)."""
    covered = 0  # the largest offset reachable through the dims seen so far
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= covered:
            return True
        covered += stride * (size - 1)
    return False


_data_ptr = torch.Tensor.data_ptr
_PARAMETER = "parameter"  # pool.owners' mark for outputs viewing a parameter's memory


class Recording:
    """One CUDA graph of a compiled graph, for one input signature."""

    __slots__ = ("name", "owner", "graph", "order", "static_at", "static_addresses", "copied", "spans", "outputs",
                 "outstanding", "replays", "last_copies", "scalars")

    def __init__(self, name: str, owner: CUDAGraphed):
        self.name, self.owner = name, owner
        self.graph = None
        self.order = -1
        self.static_at: list[int] = []          # the inputs read in place (parameters, other graphs' outputs)
        self.static_addresses: list[int] = []   # and their addresses, baked into the recording
        # (index, buffer, address, shape, dtype) of each copied input
        self.copied: list[tuple[int, torch.Tensor, int, torch.Size, torch.dtype]] = []
        self.spans: list[tuple[int, torch.Tensor, torch.Size, tuple, torch.dtype, int]] = []  # overlapping inputs
        # (index, value) of each input that is no tensor (an int input's symbol): the recording's kernels were
        # launched with its value, so another value needs a recording of its own
        self.scalars: list[tuple[int, Any]] = []
        self.outputs: list[tuple[Any, bool]] = []  # (static output, made stale by replays)
        self.outstanding: tuple | list = ()
        self.replays = 0
        self.last_copies = 0

    def copies_for(self, args: list):
        """(destinations, sources) to copy before a replay serving `args`, or None if `args` do not fit."""
        if self.static_at and list(map(_data_ptr, map(args.__getitem__, self.static_at))) != self.static_addresses:
            return None  # one loop in C: a large model reads hundreds of parameters in place
        if self.scalars and any(args[i] != value for i, value in self.scalars):
            return None
        dst, src = [], []
        for i, buf, address, shape, dtype in self.copied:
            a = args[i]
            if a.dtype != dtype or a.shape != shape:
                return None
            if a.data_ptr() != address:
                dst.append(buf)
                src.append(a)
        for i, base, shape, stride, dtype, span in self.spans:
            a = args[i]
            if a.dtype != dtype or a.shape != shape or a.stride() != stride:
                return None
            dst.append(base)
            src.append(a.as_strided((span,), (1,)))
        return dst, src

    def replay(self, dst: list, src: list) -> list:
        pool = self.owner.pool
        if dst:
            grad = torch.is_grad_enabled()
            torch._C._set_grad_enabled(False)
            try:
                if len(dst) == 1:
                    dst[0].copy_(src[0])
                else:
                    torch._foreach_copy_(dst, src)
            finally:
                torch._C._set_grad_enabled(grad)
        self.last_copies = len(dst)
        pool.invalidate_from(self.order, f"replay {self.replays + 1} of {self.name}")
        pool.ops.replay(self.graph)
        self.replays += 1
        outs = [s.detach() if isinstance(s, torch.Tensor) else s for s, _ in self.outputs]
        self.outstanding = [o for o, (_, tracked) in zip(outs, self.outputs) if tracked]
        return outs


class CUDAGraphed:
    """A compiled graph run from CUDA graphs: warm-up, record, replay (boxed calling convention)."""

    _boxed_call = True

    def __init__(self, compiled: Callable, pool: CUDAGraphPool, name: str, device: torch.device | None = None):
        self.compiled = compiled
        self.call = getattr(compiled, "boxed_call", None) or (
            compiled if getattr(compiled, "_boxed_call", False) else (lambda args: compiled(*args)))
        # results the wrapper keeps across calls (kiln.codegen.wrapper.ParameterDerived): a replay reads them
        # where they are, so they are brought up to date outside the graph first
        self.refresh = compiled.refresh if getattr(compiled, "kept", None) else None
        self.pool, self.name, self.device = pool, name, device
        self.recordings: list[Recording] = []
        self.last: Recording | None = None
        self.warmed: set = set()
        self.disabled: str | None = None
        self.stats = {"warmups": 0, "recordings": 0, "replays": 0, "eager": 0}

    def __call__(self, args: list) -> list:
        rec = self.last
        if rec is not None:
            if _set_stale is None:
                _check_not_stale(args)
            copies = rec.copies_for(args)
            if copies is not None:
                return self._replay(rec, copies, args)
        return self._miss(args)

    def _replay(self, rec: Recording, copies: tuple, args: list) -> list:
        self.stats["replays"] += 1
        if self.refresh is not None:
            self.refresh(args)
        return rec.replay(*copies)

    def _eager(self, args: list) -> list:
        self.stats["eager"] += 1
        return list(self.call(list(args)))

    def _miss(self, args: list) -> list:
        if _set_stale is None:
            _check_not_stale(args)
        for rec in self.recordings:
            copies = rec.copies_for(args)
            if copies is not None:
                self.last = rec
                return self._replay(rec, copies, args)
        if self.disabled:
            return self._eager(args)
        key = _warm_up_key(args)
        if key not in self.warmed and len(self.warmed) < 2 * MAX_RECORDINGS:  # first call with this signature
            self.warmed.add(key)
            self.stats["warmups"] += 1
            return list(self.call(list(args)))
        if len(self.recordings) >= MAX_RECORDINGS or key not in self.warmed:
            self.disabled = f"more than {MAX_RECORDINGS} input signatures (shapes or parameter addresses)"
            log.info("%s: CUDA graphs off from now on: %s", self.name, self.disabled)
            return self._eager(args)
        if self.refresh is not None:  # so that the capture finds them up to date and records no recomputation
            self.refresh(args)
        rec = self._record(args)
        if rec is None:
            return self._eager(args)
        self.last = rec
        return self._replay(rec, ([], []), args)

    def _record(self, args: list) -> Recording | None:
        pool = self.pool
        rec = Recording(f"{self.name}" + (f" (signature {len(self.recordings) + 1})" if self.recordings else ""), self)
        inputs = []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                rec.scalars.append((i, a))
                inputs.append(a)
                continue
            address = a.data_ptr()
            owner = pool.owners.get(address)
            if isinstance(a, torch.nn.Parameter) or (owner is not None and owner is not self):
                rec.static_at.append(i)
                rec.static_addresses.append(address)
                inputs.append(a)
            elif _overlapping(a):
                span = 1 + sum((sz - 1) * st for sz, st in zip(a.shape, a.stride())) if a.numel() else 0
                base = torch.empty(span, dtype=a.dtype, device=a.device)
                base.copy_(a.as_strided((span,), (1,)))
                rec.spans.append((i, base, a.shape, a.stride(), a.dtype, span))
                inputs.append(base.as_strided(a.shape, a.stride(), 0))
            else:
                buf = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                buf.copy_(a.detach())
                rec.copied.append((i, buf, buf.data_ptr(), a.shape, a.dtype))
                inputs.append(buf)
        if pool.handle is None:
            pool.handle = pool.ops.new_pool(self.device)
        try:
            rec.graph, outs = pool.ops.capture(self.call, inputs, pool.handle, self.device)
        except Exception as e:  # ops that synchronize, CPU work, ...: run without graphs
            self.disabled = f"recording failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            log.info("%s: CUDA graphs off: %s", self.name, self.disabled)
            log.debug("%s: capture failure", self.name, exc_info=True)
            return None
        in_place = {a.untyped_storage().data_ptr() for i, a in enumerate(inputs)
                    if isinstance(a, torch.Tensor) and i in rec.static_at}
        for o in outs:
            if not isinstance(o, torch.Tensor):
                rec.outputs.append((o, False))
                continue
            tracked = o.untyped_storage().data_ptr() not in in_place  # a view of a parameter is never stale
            rec.outputs.append((o, tracked))
            # read in place by the other graphs of the pool (a backward reading saved weights too)
            pool.owners.setdefault(o.data_ptr(), self if tracked else _PARAMETER)
        rec.order = len(pool.recordings)
        pool.recordings.append(rec)
        self.recordings.append(rec)
        self.stats["recordings"] += 1
        log.debug("%s: recorded a CUDA graph (%d inputs read in place, %d copied)", rec.name,
                  len(rec.static_at), len(rec.copied) + len(rec.spans))
        return rec


def _warm_up_key(args: list) -> tuple:
    """What a call must share with an earlier one to be recorded rather than warmed up: the shapes and dtypes,
    and the parameters' addresses. Layers of one class sharing a graph then each warm up in the first step and
    record in the second, in the order they run: recorded in another order (one layer warmed up while the
    next ones recorded), a layer's replay would overwrite the outputs an earlier layer saved for its backward
    in the same step (the pool's memory is shared in recording order)."""
    return tuple((tuple(a.shape), a.dtype, a.data_ptr() if isinstance(a, torch.nn.Parameter) else None)
                 if isinstance(a, torch.Tensor) else None for a in args)


def _check_not_stale(args: list) -> None:
    for a in args:
        message = getattr(a, "_kiln_stale", None)
        if message is not None:
            raise CUDAGraphError(message)


__all__ = ["CUDAGraphPool", "CUDAGraphed", "cudagraph_mark_step_begin", "CUDAGraphError"]

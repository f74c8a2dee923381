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

Pools and lanes. All graphs of one compiled model (inference, forward, backward, every signature)
allocate from private memory pools (`torch.cuda.graph_pool_handle`) of its own, one per lane: a
graph's first recording for a signature goes into lane 0, shared by all, another recording of that
graph and signature (see Paths) into the next lane. A recording keeps its static outputs for as long as
it lives, so no later recording places anything in them; its scratch memory (intermediates) was free
when it was recorded, and a recording made later in the same lane may have placed its outputs there.
So replaying a recording writes its own outputs and those of the recordings made after it in its lane,
and nothing else.

Steps. A step is a pass over the models sharing a pool: a call of a forward or inference graph begins a
step when that model (its parameters) was already called in the current one, unless a forward has run
whose backward has not (a forward called twice before one backward is one step); a graph reading no
parameter begins a step with each call, and so does `kiln.cudagraph_mark_step_begin()`. Two models sharing
a captured graph are thus one step whichever runs first: `a(x)` then `b(x)`, then `b(x)` and `a(x)`, keep
both outputs of each step. Outputs returned in an earlier step are given up: a replay may overwrite them
(see staleness).

Paths. The graphs a program calls need not repeat one sequence: a data-dependent branch, an extra
forward without backward, the forward called twice before the backward, two models sharing a captured
graph. A replay never overwrites an output returned in the current step that is still in use (held by
anything but kiln: the user, a view of it, autograd's saved tensors, a gradient waiting in autograd's
input buffer). When the recording that fits a call would, the call replays another recording of the same
graph and signature whose replay would not, and if there is none, records one in the next lane (a
recording made last in its lane overwrites nothing but its own outputs); past `MAX_RECORDINGS`, such a
call runs without graphs. After a few steps each path a program takes has its recordings and replays.
Outputs of earlier steps are not protected, as torch's CUDA graph trees do not protect those of an
earlier generation: a program rebinding `out = model(x)` holds the last step's output while it calls
again, and protecting it would double every recording.

Outputs and staleness. A replay returns the recording's static output tensors, as fresh
aliases (`detach()`: same memory, a tensor object of its own). The aliases a replay overwrites are
invalidated at that moment (each recording counts its replays: the generation an output belongs to):
reading one, or passing it to a compiled graph, raises an error naming the graph that overwrote it
rather than giving its new contents. The rule, for users: an output of a `reduce-overhead` model
is valid until the next step (until that model is called again; in training: until the next forward after
the backward); `.clone()`
what you keep longer. Views taken of an output before it went stale are not caught. An output kept
from an earlier step keeps its value until a replay writes its memory, and raises from then on. A saved
input (the recording's input buffer, refilled by its next replay) trips autograd's version check
instead: both are errors, neither a wrong gradient.
`kiln.cudagraph_mark_step_begin()` (torch.compiler.cudagraph_mark_step_begin) ends a
step explicitly: every output returned so far is invalidated at once.

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
import sys
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
        pool.begin_step()
        pool.awaiting_backward = False
        for rec in pool.recordings:
            rec.invalidate("kiln.cudagraph_mark_step_begin()")


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
        self.handles: list = []               # the memory pool of each lane, created with its first recording
        self.lanes: list[list[Recording]] = []  # each lane's recordings, in recording order
        self.recordings: list[Recording] = []  # all of them, in recording order
        self.owners: dict[int, CUDAGraphed | str] = {}  # address of a static output -> its graph (or _PARAMETER)
        self.output_storages: dict[int, list] = {}  # address of a static output's storage -> its use entry
        self.graphs: list[CUDAGraphed] = []
        self.step = 0  # counts the steps begun (a recording's outputs returned in this step are protected)
        self.awaiting_backward = False  # a forward ran whose backward has not: the step goes on
        self.called: set[int] = set()  # the models (a parameter's address) called in this step
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
        graphed = CUDAGraphed(compiled, self, name, device, kind)
        self.graphs.append(graphed)
        return graphed

    def begin_step(self) -> None:
        self.step += 1
        self.called.clear()

    def enter(self, kind: str, model: int | None) -> None:
        """A call of a graph of kind `kind` for `model` (the address of a parameter it reads; None: it reads none)
        begins a step when that model was called in this step already, unless a forward still waits for its
        backward: two models sharing the pool, called in either order, are one step."""
        if kind == "backward":
            self.awaiting_backward = False
            return
        if not self.awaiting_backward and (model is None or model in self.called):
            self.begin_step()
        self.called.add(model)
        if kind == "forward":
            self.awaiting_backward = True

    def overwritten_by(self, rec: Recording) -> list[Recording]:
        """The recordings whose outputs a replay of `rec` writes: itself and those made after it in its lane."""
        return self.lanes[rec.lane][rec.position:]

    def may_replay(self, rec: Recording) -> bool:
        """False if replaying `rec` would overwrite an output returned in this step that is still in use."""
        step = self.step
        return not any(r.returned_in == step and r.outstanding and r.in_use() for r in self.overwritten_by(rec))

    def handle(self, lane: int, device: torch.device | None):
        while len(self.handles) <= lane:
            self.handles.append(None)
            self.lanes.append([])
        if self.handles[lane] is None:
            self.handles[lane] = self.ops.new_pool(device)
        return self.handles[lane]


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
_use_count = torch._C._storage_Use_Count
_refcount = sys.getrefcount
_KILN_REFERENCES = 3  # of an alias in Recording.in_use: `outstanding`, the loop's variable, getrefcount's argument
_PARAMETER = "parameter"  # pool.owners' mark for outputs viewing a parameter's memory


class Recording:
    """One CUDA graph of a compiled graph, for one input signature."""

    __slots__ = ("name", "owner", "graph", "lane", "position", "static_at", "static_addresses", "copied", "spans",
                 "outputs", "outstanding", "returned_in", "storages", "replays", "last_copies", "scalars")

    def __init__(self, name: str, owner: CUDAGraphed, lane: int):
        self.name, self.owner = name, owner
        self.graph = None
        self.lane, self.position = lane, -1  # its memory pool, and its place in that lane's recording order
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
        self.returned_in = -1  # the pool's step in which `outstanding` was returned
        # [storage, use count] of each storage the tracked outputs view: the storage's use count while kiln's
        # references alone hold it (the static outputs, this entry, the aliases of a replay, what recordings
        # reading it in place keep); above it, something else holds an output
        self.storages: list[list] = []
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

    def in_use(self) -> bool:
        """Whether anything but kiln holds an output returned by the last replay: the alias itself (a Python
        reference, or autograd's: its TensorImpl's count), or another tensor viewing its memory (a view, a tensor
        autograd saved: its storage's count)."""
        for alias in self.outstanding:
            if _refcount(alias) > _KILN_REFERENCES or alias._use_count() > 1:
                return True
        return any(_use_count(storage._cdata) > expected for storage, expected in self.storages)

    def invalidate(self, by: str) -> None:
        if self.outstanding:
            message = _stale_message(f"{self.name} (replay {self.replays})", by)
            for t in self.outstanding:
                _invalidate(t, message)
            self.outstanding = ()

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
        by = f"replay {self.replays + 1} of {self.name}"
        for rec in pool.overwritten_by(self):
            rec.invalidate(by)
        pool.ops.replay(self.graph)
        self.replays += 1
        # a parameter the graph returns (a weight saved for the backward) is returned itself, as the warm-up
        # returned it: the backward's next call then has the signature of its warm-up, and records
        outs = [s.detach() if isinstance(s, torch.Tensor) and not isinstance(s, torch.nn.Parameter) else s
                for s, _ in self.outputs]
        self.outstanding = [o for o, (_, tracked) in zip(outs, self.outputs) if tracked]
        self.returned_in = pool.step
        return outs


class CUDAGraphed:
    """A compiled graph run from CUDA graphs: warm-up, record, replay (boxed calling convention)."""

    _boxed_call = True

    def __init__(self, compiled: Callable, pool: CUDAGraphPool, name: str, device: torch.device | None = None,
                 kind: str = "graph"):
        self.compiled = compiled
        self.kind = kind  # "inference", "forward", "backward" (kiln's AOT graphs) or "graph": where steps begin
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
        self.parameter_at: int | None = None  # the first parameter's place among the inputs, -1: none (`_model`)
        self.stats = {"warmups": 0, "recordings": 0, "replays": 0, "eager": 0}

    def __call__(self, args: list) -> list:
        self.pool.enter(self.kind, self._model(args))
        rec = self.last
        if rec is not None:
            if _set_stale is None:
                _check_not_stale(args)
            copies = rec.copies_for(args)
            if copies is not None and self.pool.may_replay(rec):
                return self._replay(rec, copies, args)
        return self._miss(args)

    def _model(self, args: list) -> int | None:
        """Which model calls: the address of the first parameter among `args` (its place is found once; models
        sharing the graph pass their parameters in the same places), or None when the graph reads none."""
        at = self.parameter_at
        if at is None or (at >= 0 and not isinstance(args[at], torch.nn.Parameter)):
            at = self.parameter_at = next((i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)), -1)
        return _data_ptr(args[at]) if at >= 0 else None

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
        lanes = set()  # the lanes of the recordings that fit `args` but would overwrite an output in use
        for rec in self.recordings:
            copies = rec.copies_for(args)
            if copies is None:
                continue
            if self.pool.may_replay(rec):
                self.last = rec
                return self._replay(rec, copies, args)
            lanes.add(rec.lane)
        if self.disabled:
            return self._eager(args)
        key = _warm_up_key(args)
        if not lanes and key not in self.warmed and len(self.warmed) < 2 * MAX_RECORDINGS:  # a new signature
            self.warmed.add(key)
            self.stats["warmups"] += 1
            return list(self.call(list(args)))
        if len(self.recordings) >= MAX_RECORDINGS and lanes:  # this path runs without graphs; the others replay
            return self._eager(args)
        if len(self.recordings) >= MAX_RECORDINGS or key not in self.warmed:
            self.disabled = f"more than {MAX_RECORDINGS} input signatures (shapes or parameter addresses)"
            log.info("%s: CUDA graphs off from now on: %s", self.name, self.disabled)
            return self._eager(args)
        if self.refresh is not None:  # so that the capture finds them up to date and records no recomputation
            self.refresh(args)
        rec = self._record(args, min(set(range(len(lanes) + 1)) - lanes))
        if rec is None:
            return self._eager(args)
        self.last = rec
        return self._replay(rec, ([], []), args)

    def _record(self, args: list, lane: int) -> Recording | None:
        pool = self.pool
        rec = Recording(f"{self.name}" + (f" (signature {len(self.recordings) + 1})" if self.recordings else ""), self,
                        lane)
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
        handle = pool.handle(lane, self.device)
        read_in_place = [pool.output_storages.get(inputs[i].untyped_storage().data_ptr()) for i in rec.static_at]
        read_in_place = [entry for entry in read_in_place if entry is not None]
        counts = [_use_count(storage._cdata) for storage, _ in read_in_place]
        try:
            rec.graph, outs = pool.ops.capture(self.call, inputs, handle, self.device)
        except Exception as e:  # ops that synchronize, CPU work, ...: run without graphs
            self.disabled = f"recording failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            log.info("%s: CUDA graphs off: %s", self.name, self.disabled)
            log.debug("%s: capture failure", self.name, exc_info=True)
            return None
        for entry, count in zip(read_in_place, counts):  # what the recording keeps of the outputs it reads is kiln's
            entry[1] += _use_count(entry[0]._cdata) - count
        in_place = {a.untyped_storage().data_ptr() for i, a in enumerate(inputs)
                    if isinstance(a, torch.Tensor) and i in rec.static_at}
        aliases: dict[int, int] = {}  # storage address -> tracked outputs viewing it (aliases of each replay)
        for o in outs:
            if not isinstance(o, torch.Tensor):
                rec.outputs.append((o, False))
                continue
            storage = o.untyped_storage()
            tracked = storage.data_ptr() not in in_place  # a view of a parameter is never stale
            rec.outputs.append((o, tracked))
            # read in place by the other graphs of the pool (a backward reading saved weights too)
            pool.owners.setdefault(o.data_ptr(), self if tracked else _PARAMETER)
            if tracked:
                if storage.data_ptr() not in aliases:
                    rec.storages.append([storage, 0])
                aliases[storage.data_ptr()] = aliases.get(storage.data_ptr(), 0) + 1
        storage = None  # the loop's last storage object holds a use of its own: measured without it
        for entry in rec.storages:
            entry[1] = _use_count(entry[0]._cdata) + aliases[entry[0].data_ptr()]
            pool.output_storages[entry[0].data_ptr()] = entry
        rec.position = len(pool.lanes[lane])
        pool.lanes[lane].append(rec)
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

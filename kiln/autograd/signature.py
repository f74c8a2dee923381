"""The calling convention between a captured graph and its ATen graphs.

A captured `gm` takes positional inputs (tensors, and constants the capture
guards on) and may read parameters and buffers through `get_attr` or
`call_module`. Its ATen graphs take one *flat* list of tensors instead: the
tensor inputs in order, then every parameter and buffer of `gm` ("lifted
state"), so that gradients and buffer mutations reach the real module state.

What `gm` returns is found by one run on fake tensors (`analyze`): each leaf of
its output structure is either a graph output, an alias of an input or of an
earlier graph output (rebuilt outside the compiled graph so it is a real view,
as in eager), or a constant (ints, None) that the graph does not compute.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.autograd.saved_versions import SavedByEager, SavedTensorLog, saved_by_eager
from kiln.autograd.storages import storage_of
from kiln.autograd.view_replay import ViewRecorder, ViewStep, replay, symbolic_sizes
from kiln.size_python import SIZE_NAMES, size_source


@dataclass(frozen=True)
class TensorSpec:
    """Shape, strides, dtype and device of a tensor: what compiled graphs specialize on."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device

    @staticmethod
    def of(t: torch.Tensor) -> TensorSpec:
        return TensorSpec(tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    @property
    def symbolic(self) -> bool:
        """Sizes or strides are SymInts (a dynamic-shape graph): they hold for every size the guards admit."""
        return any(isinstance(s, torch.SymInt) for s in self.shape + self.stride)

    @property
    def overlapping(self) -> bool:
        """Do two elements share memory (a stride 0 of a dimension of size > 1, or strides that interleave)?
        Dimensions taken from the smallest stride up: each must step past the extent of those before it. With
        symbolic sizes, a stride 0 of a dimension not of size 1, compared as expressions (no guard is added).
        An empty tensor has no elements to share anything: `a[:, 3:]` of an expanded `a` is written like any
        tensor (eager writes nothing), whatever its strides."""
        if any(not isinstance(sz, torch.SymInt) and sz == 0 for sz in self.shape):
            return False
        if self.symbolic:
            return any(_expr(st) == 0 and _expr(sz) != 1 for sz, st in zip(self.shape, self.stride))
        extent = 0
        for stride, size in sorted((st, sz) for sz, st in zip(self.shape, self.stride) if sz != 1):
            if stride <= extent:
                return True
            extent += (size - 1) * stride
        return False

    def as_gradient(self) -> TensorSpec:
        """The layout a gradient of a tensor of this spec comes in (`OutputSignature.tangent_specs`): its own
        strides; contiguous where the sizes are symbolic, since the runtime can then make any gradient match with
        `.contiguous()` without computing strides per call, and where elements share memory (an expanded
        output): no gradient can be written with those strides."""
        return self.contiguous() if self.symbolic or self.overlapping else self

    def contiguous(self) -> TensorSpec:
        strides, acc = [], 1
        for size in reversed(self.shape):
            strides.append(acc)
            acc = acc * size
        return TensorSpec(self.shape, tuple(reversed(strides)), self.dtype, self.device)

    def fake(self, mode: FakeTensorMode, requires_grad: bool = False) -> torch.Tensor:
        with mode:
            t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        return t.requires_grad_(requires_grad) if requires_grad else t


@dataclass(frozen=True, eq=False)
class IntSpec:
    """A flat input that is an int of the captured graph made a symbol (an int input that changes between
    calls): the graphs take it as a SymInt input, and their sizes may depend on it. It never requires grad."""

    value: torch.SymInt
    dtype = torch.int64  # what its value is, where the analysis asks (not a floating-point input)
    symbolic = True

    def fake(self, mode: FakeTensorMode, requires_grad: bool = False) -> torch.SymInt:
        return self.value


def is_symbolic_int(value) -> bool:
    """A SymInt that is a symbol of its own (not a size that became a constant or an expression)."""
    return isinstance(value, torch.SymInt) and value.node.expr.is_Symbol


class KilnLimit(NotImplementedError):
    """Something the autograd stage does not handle, as opposed to an op's own error: the variant runs op by op
    (kiln/autograd/aot.py), a counted fallback naming it."""


class NeedsStaticShapes(Exception):
    """A dynamic-shape graph does something whose sizes the runtime cannot yet compute per call
    (an output that is a size, or a view with symbolic geometry): compile it per input shape."""


def _require_static(value, what: str) -> None:
    if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in pytree.tree_leaves(value)):
        raise NeedsStaticShapes(f"{what} with symbolic sizes")


@dataclass(frozen=True)
class GraphOutput:
    """Leaf `index`-th of the graph's outputs."""

    index: int


@dataclass(frozen=True)
class AliasOutput:
    """A leaf that is input `input_index` itself, or another tensor on its storage: rebuilt from the real input.

    `offset` is relative to the input's own storage offset, which the tensor guards do not pin
    (`buf[1:5]` and `buf[2:6]` pass the same guard). `detach`: the leaf does not require grad
    while the input does (`x.detach()`, a view taken under no_grad), so it is rebuilt from a
    detached alias, sharing storage but not history, as eager's is. `no_grad`: a view taken under
    no_grad of a tensor that requires grad, which eager leaves requiring grad with no history: rebuilt
    under no_grad too."""

    input_index: int
    identity: bool
    shape: tuple
    stride: tuple
    offset: int
    detach: bool = False
    no_grad: bool = False
    sizes: Callable | None = None  # a dynamic graph's geometry, (shape, stride, offset) of the flat inputs
    # a view that reads the storage as another dtype (`view(dtype)`, `view_as_complex`)
    dtype: torch.dtype | None = None
    # a conjugate view (`x.conj()`, ihfft's result): the conjugate bit, which a strided view of the storage drops
    conj: bool = False
    # the view ops that made the leaf of the input, replayed on the real one (view_replay.py); None: as_strided
    replay: tuple[ViewStep, ...] | None = None
    replay_sizes: Callable | None = None  # a dynamic graph's sizes among the replayed ops' arguments
    # another output leaf the leaf views (`d.t()` returned with `d = x.detach()`): replayed on it, as eager's
    # view of it is (its `_base`), not on the input
    source_leaf: int | None = None


@dataclass(frozen=True)
class OutputAlias:
    """A leaf on the storage of graph output `output_index`, which is that storage's base tensor.

    Outputs that share storage with each other (`y, y.detach()`; `t[::2], t[1:3]`; `t.unbind()`)
    are rebuilt after the call as views of their common base, which the graph returns for them
    (an intermediate the user may never see): a code generator keeps each graph output's layout,
    not storage shared between outputs, and autograd could not let two outputs of one Function
    that view each other be modified in place. `offset` is relative to the base's storage offset;
    `detach`, `no_grad`, `sizes`, `dtype`, `conj`, `replay`, `replay_sizes` and `source_leaf` as for
    `AliasOutput`."""

    output_index: int
    identity: bool
    shape: tuple
    stride: tuple
    offset: int
    detach: bool = False
    no_grad: bool = False
    sizes: Callable | None = None
    dtype: torch.dtype | None = None
    conj: bool = False
    replay: tuple[ViewStep, ...] | None = None
    replay_sizes: Callable | None = None
    source_leaf: int | None = None


@dataclass(frozen=True)
class ConstantOutput:
    value: Any
    sizes: Callable | None = None  # a size of a dynamic graph (`x.shape[0]`): its value from the flat inputs


@dataclass
class OutputSignature:
    """What one requires-grad pattern of the inputs makes `gm` return."""

    tree: pytree.TreeSpec
    leaves: list
    graph_outputs: list[TensorSpec]
    requires_grad: list[bool]
    mutated_grad_inputs: list[tuple[int, int]]
    """(input, graph output): inputs updated in place that require grad, before the call or (written with a
    value that does) after it. Their new value is a differentiable graph output, copied into the input
    under autograd after the call, so that the input's history continues through the compiled graph as
    in eager; or, for an input written only under no_grad (`requires_grad[output]` False), a value copied
    outside autograd, as eager's writes were (`with torch.no_grad(): w.clamp_(-1, 1)` on a leaf)."""
    graph_sources: list[tuple[int, bool]]
    """Per graph output before the mutated inputs: (leaf, whether it is that leaf's `_base`)."""
    reaches: list[frozenset[int]] | None = None
    """Per differentiable graph output (in `differentiable()` order), the flat inputs its autograd
    graph reaches; None with fewer than two (the backward then always receives every gradient).
    A backward that gets no gradient for some outputs gives None, as eager does, to the inputs
    that only those outputs reach, not a zero tensor."""

    restrided_inputs: list[tuple[int, tuple]] = field(default_factory=list)
    """(input, (shape, stride, storage offset change)): inputs whose geometry an in-place view op changed (`t_`,
    `unsqueeze_`, `as_strided_`). Functionalization keeps the data in the graph; the runtime gives the
    input its new geometry after the call, as AOTAutograd does. An in-place view op counts as a write
    (it bumps the version counter), so an input that requires grad is also in `mutated_grad_inputs`: the
    graph works on a copy, and the input, restrided under autograd (as eager's op records a view's
    history on it), then receives the graph's value of it."""


    multi_output_views: tuple[int, ...] = ()
    """Leaves that eager returns as outputs of a view op with several outputs (`unbind`, `split`, `chunk`)
    under autograd, which eager does not let be modified in place. A rebuilt or computed tensor would
    let it: they are marked so again (`_as_multi_output_view`)."""

    saved_by_eager: list[SavedByEager] = field(default_factory=list)
    """The inputs and outputs whose values eager's backward saves: the runtime raises eager's error if one
    is written before a backward that reaches it (`saved_versions`)."""

    build_order: tuple[int, ...] | None = None
    """The order `assemble` builds the leaves in where some are rebuilt on another (`source_leaf`), which comes
    first; None: in order."""

    gradients_at_views: tuple[int, ...] = ()
    """Graph outputs that are the base of one output leaf, a real view of it (`.real` of a complex intermediate)
    that the graph also reads: the backward is traced with that leaf's gradient, read off the base's incoming
    gradient, so that the gradient of the leaf's uses in the graph meets it at the leaf, in the leaf's dtype,
    as in eager (`gradient_at_view`). Met at the complex base instead, ATen's complex add turns an infinite
    real gradient into `inf + nanj`, and the next product spreads the NaN. The rest of the base's gradient
    (`gradient_off_view`: zero unless the caller reached the base through `leaf._base`) gets a backward of its
    own (joint.py)."""

    unversioned_inputs: tuple[int, ...] = ()
    """(A training graph's) inputs whose version counter the run left as it was: a write the functional graph makes
    into one went through `.data`, which shares the storage and not the version counter. Eager's autograd sees no
    such write (it neither raises nor records it, and what it saved reads the new values): the runtime writes it
    through `.data` too (`MutationWriter`)."""

    def differentiable(self) -> list[int]:
        return [i for i, rg in enumerate(self.requires_grad) if rg]

    def plain_outputs(self) -> str | None:
        """"single" or "tuple" when the output is the graph's one output or all of them in order, else None."""
        if list(self.leaves) != [GraphOutput(i) for i in range(len(self.leaves))] or self.mutated_grad_inputs \
                or self.restrided_inputs or self.multi_output_views:
            return None
        if len(self.leaves) != len(self.graph_outputs):
            return None
        if self.tree == pytree.tree_structure(0):
            return "single"
        if self.tree == pytree.tree_structure(tuple(range(len(self.leaves)))):
            return "tuple"
        return None

    def tangent_specs(self) -> list[TensorSpec]:
        """The incoming gradients the backward graph is traced with, one per differentiable output, each laid out
        as `TensorSpec.as_gradient` says."""
        return [self.graph_outputs[i].as_gradient() for i in self.differentiable()]


REFUSE_GRAD = {"resize_", "resize_as_", "set_", torch.Tensor.resize_, torch.Tensor.resize_as_, torch.Tensor.set_}
"""In-place ops (method names and functions, as a captured graph calls them) that raise on a tensor requiring grad."""


class FlatProgram:
    """`gm` seen as a function of one flat list of tensors (inputs, then lifted state)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, static_shapes: bool = False):
        self.gm = gm
        self.num_args = len(example_inputs)
        self.shared_mode = None if static_shapes else _symbolic_fake_mode(gm)
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        symbols = set() if self.shared_mode is None else {
            i for i, n in enumerate(placeholders) if is_symbolic_int(_example(n)) and not isinstance(
                example_inputs[i], torch.Tensor)}
        # The flat inputs: the tensors, and the int inputs that are symbols (SymInt inputs of the graphs).
        self.tensor_positions = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.Tensor) or i in symbols]
        # Other inputs are baked in as constants: the capture guards on their values (and a graph compiled per
        # shape, `static_shapes`, is compiled per value of its int inputs).
        self.constants = {i: a for i, a in enumerate(example_inputs) if i not in self.tensor_positions}
        self.has_int_inputs = bool(symbols)
        # a graph entering autocast casts as eager's autocast cache lets it (autocast_cache.py): its training
        # variants tell which inputs the cache may hold
        self.enters_autocast = any(n.target is torch.amp.autocast_mode._enter_autocast for n in gm.graph.nodes)
        self.state_names = [n for n, _ in gm.named_parameters()] + [n for n, _ in gm.named_buffers()]
        inputs = [example_inputs[i] for i in self.tensor_positions]
        # which flat inputs are parameters (their type is guarded): their owner holds them, and writes them in place
        # only in an optimizer's step, after the backward (partition.py may save them to recompute from, where
        # eager saves other values; not a leaf that requires grad, which the caller may write: aot.py
        # `_exposed_primals`)
        self.parameters = tuple(isinstance(t, torch.nn.Parameter) for t in inputs + self.state())
        if self.shared_mode is not None:  # trace with the capture's symbolic sizes, not this call's
            inputs = [_example(placeholders[i]) for i in self.tensor_positions]
        self.input_specs = [TensorSpec.of(t) if isinstance(t, torch.Tensor) else IntSpec(t)
                            for t in inputs + self.state()]

    @property
    def symbolic(self) -> bool:
        return self.shared_mode is not None

    def shape_env(self):
        """The shape environment of a dynamic-shape graph (None for a static one)."""
        return self.shared_mode.shape_env if self.shared_mode is not None else None

    def size_sources(self) -> dict:
        """Each size symbol of a dynamic graph -> (flat input, dimension) whose size it is, or (flat input, None)
        for an int input that is the symbol."""
        sources: dict = {}
        for i, spec in enumerate(self.input_specs):
            if isinstance(spec, IntSpec):  # the int itself: dimension None
                sources.setdefault(spec.value.node.expr, (i, None))
                continue
            for d, size in enumerate(spec.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    sources.setdefault(size.node.expr, (i, d))
        return sources

    def symbolic_inputs(self) -> list[torch.Tensor]:
        """Fake flat inputs with the graph's symbolic sizes, for guard expressions over the real ones."""
        return [spec.fake(self.shared_mode) for spec in self.input_specs]

    def fake_mode(self) -> FakeTensorMode:
        """The mode the graphs are traced in: a fresh one, or for a dynamic-shape graph the capture's.

        The capture's mode owns the shape environment whose symbols the graph's sizes are:
        tracing in it keeps the sizes symbolic, and records in that environment any guard
        the ATen ops add (checked with the capture's own guards).
        """
        return self.shared_mode or FakeTensorMode(allow_non_fake_inputs=True)

    @property
    def num_inputs(self) -> int:
        return len(self.input_specs)

    def flatten_inputs(self, args: tuple) -> list[torch.Tensor]:
        """The real flat inputs of one call: its tensor arguments, then `gm`'s current state."""
        if len(args) != self.num_args:
            raise TypeError(f"kiln: compiled graph takes {self.num_args} inputs, got {len(args)}")
        return [args[i] for i in self.tensor_positions] + self.state()

    def state(self) -> list[torch.Tensor]:
        """`gm`'s parameters and buffers now (an optimizer or `load_state_dict` may have replaced them)."""
        if not self.state_names:  # the capture lifts them to inputs
            return []
        return [t for _, t in self.gm.named_parameters()] + [t for _, t in self.gm.named_buffers()]

    def run(self, flat: list) -> Any:
        """Call `gm` on flat inputs (real or fake), returning what `gm` returns."""
        n = len(self.tensor_positions)
        args = [None] * self.num_args
        for i, v in self.constants.items():
            args[i] = v
        for pos, t in zip(self.tensor_positions, flat[:n]):
            args[pos] = t
        if not self.state_names:
            return self.gm(*args)
        state = dict(zip(self.state_names, flat[n:]))
        return torch.func.functional_call(self.gm, state, tuple(args), strict=True, tie_weights=True)

    def graph_function(self, signature: OutputSignature, copy: Callable | None = None,
                       at_views: tuple[int, ...] = ()) -> Callable:
        """The function the ATen graphs compute: flat inputs -> list of the graph's output tensors. `copy(i, t)`:
        the copy of input `i` the graph writes (a clone by default). The graph outputs in `at_views` are given as
        the leaf they are the base of (for the joint trace: `OutputSignature.gradients_at_views`)."""
        sources = signature.graph_sources
        mutated = [i for i, _ in signature.mutated_grad_inputs]
        copy = copy or (lambda i, t: t.clone())

        def graph_fn(*flat):
            flat = list(flat)
            for i in mutated:  # mutate a copy: the input itself is updated under autograd, after the call
                flat[i] = copy(i, flat[i])
            leaves = pytree.tree_leaves(self.run(flat))
            return [leaves[k]._base if of_base and j not in at_views else leaves[k]
                    for j, (k, of_base) in enumerate(sources)] + [flat[i] for i in mutated]

        return graph_fn

    def analyze(self, requires_grad: tuple[bool, ...] | None) -> OutputSignature:
        """Run `gm` once on fake inputs to classify its outputs (grad mode on iff requires_grad)."""
        # Inputs that require grad are run as copies (non-leaves, with the input's strides, which
        # may be written in place), as the graph function runs them when they are mutated; a
        # copy's version counter then tells whether it was. Without grad mode, floating inputs
        # are run so too: an alias then tells eager's `x.detach()` (no grad) from `x[0]`
        # (requires grad, as a view taken under no_grad of an input that requires grad does).
        if requires_grad is not None:
            return self._analyze(requires_grad, requires_grad)
        if any(n.target in REFUSE_GRAD for n in self.gm.graph.nodes if n.op in ("call_method", "call_function")):
            # inputs that do not require grad at the call run as they are (those that do raise in eager too)
            return self._analyze(None, (False,) * self.num_inputs)
        try:
            return self._analyze(None, [s.dtype.is_floating_point for s in self.input_specs])
        except RuntimeError:
            # an op that refuses an argument requiring grad (batch norm's running statistics, run with grad
            # mode on inside the graph after a no_grad block): the inputs run as they are, as at the call
            return self._analyze(None, (False,) * self.num_inputs)

    def _analyze(self, requires_grad: tuple[bool, ...] | None, as_grad) -> OutputSignature:
        """`analyze`, running as non-leaves requiring grad the inputs that `as_grad` says."""
        mode = self.fake_mode()
        rg = requires_grad or (False,) * self.num_inputs
        values = [_non_leaf(s, mode) if r else s.fake(mode) for s, r in zip(self.input_specs, as_grad)]
        # the bookkeeping below is over tensors: an int input stands in as an empty tensor no op reads
        fakes = [v if isinstance(v, torch.Tensor) else _stand_in(mode) for v in values]
        versions = [_version_of(f) for f in fakes]
        # the sizes themselves, read as expressions only when compared: the run may add a size replacement
        # (a reshape's `s0 = s2*s3`) that rewrites the expressions of the fakes' sizes, changed or not
        sizes_before = [(f.shape, f.stride(), f.storage_offset()) for f in fakes]
        storage_sizes = [f.untyped_storage().nbytes() for f in fakes]
        input_nodes = {f.grad_fn: i for i, f in enumerate(fakes) if rg[i]}  # before in-place ops replace them
        grad_fns = [f.grad_fn for f in fakes]
        saved, views = SavedTensorLog(), ViewRecorder()
        with torch.set_grad_enabled(requires_grad is not None), saved.recording():
            with mode, symbolic_dispatch(mode), views:  # factories (torch.arange(n)) make fakes too
                out = self.run(values)
        geometries = [_geometry_expressions(*g) for g in sizes_before]
        leaves, tree = pytree.tree_flatten(out)
        outputs = _OutputClassifier(fakes, requires_grad is not None, self.size_sources(), views, mode)
        kinds = outputs.classify(leaves, self._read_in_graph(len(leaves)))
        mutated, num_returned = [], len(outputs.tensors)
        for i, fake in enumerate(fakes):
            # An input written in place with a value that requires grad requires grad after the call
            # (`b[...] = d`), as eager's does, whether or not it did before.
            if (rg[i] and fake._version != versions[i]) or (requires_grad is not None and not rg[i]
                                                            and fake.requires_grad):
                mutated.append((i, len(outputs.specs)))  # with the geometry an in-place view op gave it
                same_geometry = _geometry_of(fake) == geometries[i]
                outputs.specs.append(self.input_specs[i] if same_geometry else TensorSpec.of(fake))
                # written only under no_grad (its grad_fn is the one it came with): autograd saw no write,
                # so the input keeps its history (a leaf stays a leaf) and receives the value outside autograd
                outputs.needs_grad.append(not (rg[i] and fake.grad_fn is grad_fns[i]))
                outputs.tensors.append(fake)
        differentiable = [t for t, rg in zip(outputs.tensors, outputs.needs_grad) if rg]
        reaches = _reached_inputs(differentiable, input_nodes) if requires_grad and len(differentiable) > 1 else None
        if any(f.untyped_storage().nbytes() != n for f, n in zip(fakes, storage_sizes)):
            raise KilnLimit("kiln: resize_ that grows an input's storage")
        restrided = self._restrided(fakes, geometries)
        watched = saved_by_eager(saved, fakes, versions, outputs.tensors,
                                 num_returned, [j for j, g in enumerate(outputs.needs_grad) if g]) \
            if requires_grad is not None else []
        # written where no version counter saw it (batch norm's running statistics), in training and inference
        unversioned = tuple(i for i, (f, v) in enumerate(zip(fakes, versions)) if v is not None and f._version == v)
        return OutputSignature(tree, kinds, outputs.specs, outputs.needs_grad, mutated, outputs.sources, reaches,
                               restrided, tuple(k for k, leaf in enumerate(leaves) if _is_multi_output_view(leaf)),
                               watched, _build_order(kinds), tuple(outputs.gradients_at_views), unversioned)

    def _read_in_graph(self, num_leaves: int) -> set[int]:
        """The output leaves the graph also reads (its output node is not the only user of theirs); every leaf
        where the output is not a plain structure of nodes."""
        output = self.gm.graph.output_node()
        nodes = pytree.tree_leaves(output.args[0])
        if len(nodes) != num_leaves:
            return set(range(num_leaves))
        return {k for k, n in enumerate(nodes) if isinstance(n, torch.fx.Node) and set(n.users) - {output}}

    def _restrided(self, fakes: list, before: list[tuple]) -> list[tuple[int, tuple]]:
        """The inputs whose geometry the run changed in place, with their new geometry."""
        restrided = [(i, _geometry_of(f)) for i, (f, g) in enumerate(zip(fakes, before)) if _geometry_of(f) != g]
        if restrided and self.size_sources():  # other outputs' sizes are read off the inputs' sizes
            raise NeedsStaticShapes("an input whose sizes an in-place view op (t_, unsqueeze_) changes")
        # the offset relative to the input's own (tensor guards do not pin it: `buf[1:]` passes as `buf[:-1]`)
        return [(i, (tuple(map(int, g[0])), tuple(map(int, g[1])), int(g[2]) - int(before[i][2])))
                for i, g in restrided]

    def assemble(self, signature: OutputSignature, flat: list, graph_outs: list) -> Any:
        """Rebuild `gm`'s output structure from the graph's outputs, aliases and constants."""
        leaves = [None] * len(signature.leaves)
        for k in signature.build_order or range(len(leaves)):
            leaf = signature.leaves[k]
            if isinstance(leaf, GraphOutput):
                leaves[k] = graph_outs[leaf.index]
            elif isinstance(leaf, (AliasOutput, OutputAlias)):
                base = flat[leaf.input_index] if isinstance(leaf, AliasOutput) else graph_outs[leaf.output_index]
                leaves[k] = _rebuild(base if leaf.source_leaf is None else leaves[leaf.source_leaf], leaf, flat)
            else:
                leaves[k] = leaf.value if leaf.sizes is None else leaf.sizes(flat)[0]
        for k in signature.multi_output_views:
            leaves[k] = _as_multi_output_view(leaves[k])
        return pytree.tree_unflatten(leaves, signature.tree)


def _build_order(kinds: list) -> tuple[int, ...] | None:
    """The leaves in an order that builds each `source_leaf` before the leaves rebuilt on it (None: in order)."""
    def depth(k: int) -> int:
        source = getattr(kinds[k], "source_leaf", None)
        return 0 if source is None else 1 + depth(source)

    depths = [depth(k) for k in range(len(kinds))]
    return tuple(sorted(range(len(kinds)), key=depths.__getitem__)) if any(depths) else None


_MULTI_OUTPUT_NODE = torch._C._autograd.CreationMeta.MULTI_OUTPUT_NODE


def _is_multi_output_view(t) -> bool:
    """Is `t` (a fake of the analysis run) a view made by an op with several outputs, under autograd?"""
    return (isinstance(t, torch.Tensor) and t.requires_grad and t._is_view()
            and torch._C._autograd._get_creation_meta(t) == _MULTI_OUTPUT_NODE)


def _as_multi_output_view(t: torch.Tensor) -> torch.Tensor:
    """`t` as a view that autograd treats as an output of `unbind`/`split`: an in-place op on it raises
    eager's error. A tensor the graph computed (the view's base stayed inside it) becomes a view of itself."""
    if not t.requires_grad:  # rebuilt under no_grad, or detached: eager's would not be marked either
        return t
    view = t if t._is_view() else t.view_as(t)
    torch._C._autograd._set_creation_meta(view, _MULTI_OUTPUT_NODE)
    return view


def _rebuild(base: torch.Tensor, leaf: AliasOutput | OutputAlias, flat: list) -> torch.Tensor:
    """The output `leaf` describes, as a tensor on `base`'s storage (as eager's shares it), conjugated where
    eager's is a conjugate view of it."""
    view = _strided_view(base, leaf, flat)
    return view.conj() if leaf.conj else view


def _strided_view(base: torch.Tensor, leaf: AliasOutput | OutputAlias, flat: list) -> torch.Tensor:
    if leaf.identity:
        return base
    if leaf.detach:
        base = base.detach()
    with torch.no_grad() if leaf.no_grad else contextlib.nullcontext():
        if leaf.replay is not None:  # eager's own view ops (view_replay.py)
            return replay(base, leaf.replay, leaf.replay_sizes(flat) if leaf.replay_sizes is not None else ())
        shape, stride, offset = leaf.sizes(flat) if leaf.sizes is not None else (leaf.shape, leaf.stride, leaf.offset)
        if leaf.dtype is not None:
            return _reinterpreting_view(base, leaf.dtype, shape, stride, offset)
        if shape is None:  # the base's own geometry, whatever its sizes are this call
            return base if leaf.detach else base.view_as(base)
        return base.as_strided(shape, stride, base.storage_offset() + offset)


def _reinterpreting_view(base: torch.Tensor, dtype: torch.dtype, shape: tuple, stride: tuple,
                         offset: int) -> torch.Tensor:
    """The view of `base`'s storage as `dtype` with this geometry (in `dtype`'s elements, `offset` from where
    `base` starts). Between complex and real it is `view_as_complex` / `view_as_real` of a view of `base`,
    through which autograd follows; other dtype views have no gradient (in eager neither)."""
    if _is_complex_of(dtype, base.dtype):
        real = base.as_strided((*shape, 2), (*(2 * s for s in stride), 1), base.storage_offset() + 2 * offset)
        return torch.view_as_complex(real)
    if _is_complex_of(base.dtype, dtype) and shape and shape[-1] == 2 and stride[-1] == 1 and offset % 2 == 0:
        pairs = base.as_strided(shape[:-1], tuple(s // 2 for s in stride[:-1]), base.storage_offset() + offset // 2)
        return torch.view_as_real(pairs)
    base, start = _reinterpreted(base, dtype)
    return base.as_strided(shape, stride, start + offset)


def _is_complex_of(complex_dtype: torch.dtype, real_dtype: torch.dtype) -> bool:
    return complex_dtype.is_complex and not real_dtype.is_complex and real_dtype.to_complex() == complex_dtype


def _reinterpreted(base: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """`base`'s storage read as `dtype` elements, and where `base` starts in them. At the same element size,
    `base` itself viewed as `dtype`; otherwise its whole storage as a 1-D tensor (a dtype view of another
    element size needs a contiguous last dimension, which the storage always has)."""
    if dtype.itemsize == base.dtype.itemsize:
        return base.view(dtype), base.storage_offset()
    unit = max(dtype.itemsize, base.dtype.itemsize)
    whole = base.as_strided((base.untyped_storage().nbytes() // unit * (unit // base.dtype.itemsize),), (1,), 0)
    return whole.view(dtype), base.storage_offset() * base.dtype.itemsize // dtype.itemsize


def _stand_in(mode: FakeTensorMode) -> torch.Tensor:
    with mode:
        return torch.empty(0)


def _example(node: torch.fx.Node):
    return node.meta.get("example_value", node.meta.get("val"))


def _non_leaf(spec: TensorSpec, mode: FakeTensorMode) -> torch.Tensor:
    """A fake that requires grad and is not a leaf (so it may be written in place), with `spec`'s strides."""
    with mode, torch.enable_grad():
        return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device=spec.device).copy_(
            spec.fake(mode, True))



class _OutputClassifier:
    """Sorts the tensor leaves of one fake run of `gm` into graph outputs and aliases (see `OutputSignature`)."""

    def __init__(self, fakes: list[torch.Tensor], grad_mode: bool, size_sources: dict, views: ViewRecorder,
                 mode: FakeTensorMode):
        self.fakes = fakes
        self.size_sources = size_sources
        self.views, self.mode = views, mode
        self.grad_mode = grad_mode  # without it, every view is one taken under no_grad: the call's mode decides
        self.inputs: dict[StorageWeakRef, int] = {}
        for i, f in enumerate(fakes):
            self.inputs.setdefault(storage_of(f), i)
        self.specs: list[TensorSpec] = []
        self.needs_grad: list[bool] = []
        self.sources: list[tuple[int, bool]] = []
        self.tensors: list[torch.Tensor] = []  # the fake value of each graph output
        self.gradients_at_views: list[int] = []  # see OutputSignature.gradients_at_views

    def classify(self, leaves: list, read_in_graph: set[int]) -> list:
        groups: dict[StorageWeakRef, list[int]] = {}  # storage -> the leaves on it (none on an input's)
        for k, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and storage_of(leaf) not in self.inputs:
                groups.setdefault(storage_of(leaf), []).append(k)
        roots: dict[StorageWeakRef, tuple[int, torch.Tensor]] = {}  # storage -> (graph output, base)
        kinds = []
        for k, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                if not isinstance(leaf, torch.SymInt):
                    _require_static(leaf, "an output that is a symbolic float or bool")
                kinds.append(ConstantOutput(leaf, _size_function((leaf,), self.size_sources, "an output that is a size")
                                            if isinstance(leaf, torch.SymInt) else None))
                continue
            storage = storage_of(leaf)
            if storage in self.inputs:
                i = self.inputs[storage]
                kinds.append(self._alias(AliasOutput, i, self.fakes[i], leaves, k))
            elif len(groups[storage]) == 1 and not _views_an_intermediate_with_history(leaf):
                kinds.append(GraphOutput(self._output(leaf, k, False)))  # its storage is its own: returned as it is
            else:
                if storage not in roots:
                    roots[storage] = self._base(leaves, groups[storage])
                index, base = roots[storage]
                if len(groups[storage]) == 1 and k in read_in_graph and _gradient_meets_at_view(leaf, base):
                    self.gradients_at_views.append(index)
                kinds.append(self._alias(OutputAlias, index, base, leaves, k))
        return kinds

    def _alias(self, kind: type, index: int, base: torch.Tensor, leaves: list, k: int) -> AliasOutput | OutputAlias:
        """The alias (`kind`, of input or graph output `index`, whose value is `base`) that rebuilds leaf `k`: on
        the nearest other leaf it views where that one is no view itself (eager's `d.t()` of a returned
        `d = y.detach()` views `d`, not `y`) and the view ops replay from there, else on `base`."""
        leaf = leaves[k]
        others = {id(t): j for j, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t is not leaf}
        source = next((others[id(t)] for t in self.views.ancestors(leaf) if id(t) in others), None)
        if source is not None and leaves[source]._base is None and leaves[source] is not base:
            steps, sizes = _replayed(leaf, leaves[source], self.views, self.mode, self.size_sources)
            if steps is not None:
                return kind(index, False, None, None, 0, *_history(leaf, leaves[source], self.grad_mode), None, None,
                            False, steps, sizes, source)
        return kind(index, *self._geometry(leaf, base))

    def _geometry(self, leaf: torch.Tensor, base: torch.Tensor) -> tuple:
        """The fields of an alias of `base` (`AliasOutput`, `OutputAlias`) that rebuild `leaf`: its view ops where
        they replay (view_replay.py) and `leaf` has autograd history or `base` shares memory between elements (its
        gradient is eager's only so) or `leaf` views another tensor than `base` views (a detached alias on the way,
        `y.detach()[1:]`, is the replayed one's `_base` too), else its geometry (`_view_geometry`: one `as_strided`,
        cheaper per call)."""
        steps, sizes = None, None
        if (self.grad_mode and leaf.requires_grad) or TensorSpec.of(base).overlapping or \
                leaf._base is not _with_base(base) or leaf.is_neg() != base.is_neg():
            steps, sizes = _replayed(leaf, base, self.views, self.mode, self.size_sources)
        if steps is None:
            if leaf.is_neg() != base.is_neg():  # a strided view of the memory would read its values negated
                raise KilnLimit("kiln: an output that is a negated view (`z.conj().imag`) made by ops "
                                          "that do not replay")
            return (*_view_geometry(leaf, base, self.grad_mode, self.size_sources), leaf.is_conj() != base.is_conj())
        return (False, None, None, 0, *_history(leaf, base, self.grad_mode), None, None, False, steps, sizes)

    def _output(self, t: torch.Tensor, leaf: int, of_base: bool) -> int:
        self.specs.append(TensorSpec.of(t))
        self.needs_grad.append(t.requires_grad)
        self.sources.append((leaf, of_base))
        self.tensors.append(t)
        return len(self.specs) - 1

    def _base(self, leaves: list, group: list[int]) -> tuple[int, torch.Tensor]:
        """A graph output for the leaves of `group`, which share one storage: a leaf's `_base`
        (or the leaf) whose extent covers every other leaf, so each can be rebuilt on it. Bases with autograd
        history come first: a leaf with history rebuilt on a detached one (`y.detach()` returned before `y`)
        would lose it, while a detached leaf is rebuilt on any base by detaching it. Then the tensor that owns the
        storage before its views and detached aliases: a leaf rebuilt as a view of a detached alias would come to
        require grad with it (`t.detach().requires_grad_()` after the call), where eager's never does."""
        for k in sorted(group, key=lambda k: (not _with_base(leaves[k]).requires_grad,
                                              self.views.depth(_with_base(leaves[k])))):
            of_base = leaves[k]._base is not None
            base = leaves[k]._base if of_base else leaves[k]
            if all(leaves[j] is base or _same_geometry(leaves[j], base) or _covers(base, leaves[j]) for j in group):
                return self._output(base, k, of_base), base
        raise KilnLimit("kiln: outputs that share storage, none of them (or their base) covering the others")


def _with_base(leaf: torch.Tensor) -> torch.Tensor:
    """The tensor `leaf` views, or `leaf`."""
    return leaf._base if leaf._base is not None else leaf


def _views_an_intermediate_with_history(leaf: torch.Tensor) -> bool:
    """A view, with autograd history, of a tensor the graph made: returned by the compiled Function as it is,
    autograd would mark it a view made inside a custom Function, which cannot be written in place (eager's
    can). The graph returns its base instead, and the view is rebuilt on it, as for outputs sharing storage."""
    return leaf._base is not None and leaf.requires_grad


def _gradient_meets_at_view(leaf: torch.Tensor, base: torch.Tensor) -> bool:
    """Is `leaf` a real view of complex `base` whose gradient can be read off the base's gradient
    (`gradient_at_view`)? The leaf may not share memory between elements, and the base's gradient must come with
    the base's own strides (`TensorSpec.as_gradient`). (A complex view of a real base meets its gradients in the
    real base, which ATen's real add cannot make NaN.)"""
    if not (base.is_complex() and not base.is_conj() and not leaf.is_complex() and leaf.requires_grad):
        return False
    spec = TensorSpec.of(base)
    return not TensorSpec.of(leaf).overlapping and tuple(map(_expr, spec.as_gradient().stride)) == \
        tuple(map(_expr, spec.stride))


def gradient_at_view(gradient: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """The gradient of `leaf`, a real view of complex `leaf._base`, read off `gradient`, the base's (laid out as
    the base): autograd's view backward put the leaf's gradient there, and zeros elsewhere. Read through
    `view_as_real`, which a backward run with create_graph=True differentiates again (a dtype view would not). A
    negated view (`c.conj().imag`, the imaginary parts read negated) has its gradient there negated."""
    read = torch.view_as_real(gradient).as_strided(tuple(leaf.shape), tuple(leaf.stride()), _leaf_start(gradient, leaf))
    return read.neg() if leaf.is_neg() else read


def gradient_off_view(gradient: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """`gradient` (the base's, laid out as the base) with the real numbers `leaf` reads set to zero, computed
    without writing into a view (functionalization cannot scatter through `gradient_at_view`'s `as_strided`): the
    storage's real numbers, those at the leaf's positions zeroed by index."""
    pairs = torch.view_as_real(gradient)
    if any(isinstance(d, torch.SymInt) for d in pairs.shape):  # contiguous (`_gradient_meets_at_view`): its size,
        size = math.prod(pairs.shape)  # multiplied where tracing records it (a storage's symbolic size is not)
    else:
        size = 2 * gradient.untyped_storage().nbytes() // gradient.dtype.itemsize
    positions = torch.arange(size, device=gradient.device).as_strided(
        tuple(leaf.shape), tuple(leaf.stride()), _leaf_start(gradient, leaf))
    flat = pairs.as_strided((size,), (1,), 0).index_put((positions.reshape(-1),), pairs.new_zeros(()))
    return torch.view_as_complex(flat.as_strided(tuple(pairs.shape), tuple(pairs.stride()), pairs.storage_offset()))


def _leaf_start(gradient: torch.Tensor, leaf: torch.Tensor) -> int:
    """Where `leaf` starts in the storage of `gradient` (laid out as `leaf._base`), read as real numbers."""
    return 2 * gradient.storage_offset() + leaf.storage_offset() - 2 * leaf._base.storage_offset()


def _reached_inputs(roots: list[torch.Tensor], input_nodes: dict) -> list[frozenset[int]]:
    """Per root, the inputs (by their autograd node) that a backward from it reaches: eager's
    backward gives those, and only those, a gradient."""
    memo: dict = {}
    return [_reach(root.grad_fn, input_nodes, memo) if root.grad_fn is not None else frozenset() for root in roots]


def _reach(node, input_nodes: dict, memo: dict) -> frozenset[int]:
    """The inputs reachable from autograd node `node` (iterative: autograd graphs run deep)."""
    stack = [(node, False)]
    while stack:
        current, expanded = stack.pop()
        if current in memo:
            continue
        children = [child for child, _ in current.next_functions if child is not None]
        if not expanded:
            stack.append((current, True))
            stack.extend((child, False) for child in children if child not in memo)
            continue
        found = {input_nodes[current]} if current in input_nodes else set()
        memo[current] = frozenset(found.union(*(memo[child] for child in children)))
    return memo[node]


def _replayed(leaf: torch.Tensor, base: torch.Tensor, views: ViewRecorder, mode: FakeTensorMode,
              size_sources: dict) -> tuple[tuple[ViewStep, ...] | None, Callable | None]:
    """(the view ops that made `leaf` of `base`, the function computing their symbolic sizes per call or None);
    (None, None) where `leaf` is `base`, or no chain of recorded views of it, or the chain replayed on `base` does
    not give `leaf`'s geometry (an in-place view op changed a tensor of it later), or its sizes are not read off
    the inputs."""
    steps = views.chain(leaf, base)
    if not steps:
        return None, None
    try:
        with mode, symbolic_dispatch(mode), torch.no_grad():
            replayed = replay(base, steps)
    except Exception:  # noqa: BLE001 -- a chain that does not replay is rebuilt by its geometry
        return None, None
    if not _same_geometry(replayed, leaf) or (replayed.is_conj(), replayed.is_neg()) != (leaf.is_conj(), leaf.is_neg()):
        return None, None
    steps, sizes = symbolic_sizes(steps)
    if not sizes:
        return steps, None
    try:
        return steps, _size_function(tuple(sizes), size_sources, "an output that views another tensor")
    except NeedsStaticShapes:
        return None, None


def _history(leaf: torch.Tensor, base: torch.Tensor, grad_mode: bool) -> tuple[bool, bool]:
    """(detach, no_grad) of an alias rebuilding `leaf` on `base` (see `AliasOutput`).

    Detached: eager's leaf has no history where the base has, or is no view at all (`y.detach()`, or `y`
    beside its detached alias chosen as the base): rebuilt as a view, it would come to require grad with
    the base (`d.requires_grad_()` after the call), which a tensor that is no view never does."""
    return (not leaf.requires_grad and (base.requires_grad or leaf._base is None),
            grad_mode and leaf.requires_grad and leaf.grad_fn is None and leaf._is_view())  # taken under no_grad


def _view_geometry(leaf: torch.Tensor, base: torch.Tensor, grad_mode: bool, size_sources: dict) -> tuple:
    """(identity, shape, stride, offset relative to `base`'s, detach, no_grad, sizes, dtype) of `leaf` on `base`'s
    storage; dtype None where `leaf` reads it as `base`'s dtype.

    Shape None: `base`'s own geometry (`y.detach()`), which holds for every size of a dynamic graph.
    With symbolic sizes, `sizes` computes the geometry of each call from its inputs."""
    if leaf is base:
        return True, None, None, 0, False, False, None, None
    history = _history(leaf, base, grad_mode)
    if leaf.dtype != base.dtype:
        return _reinterpreting_geometry(leaf, base, history)
    if _same_geometry(leaf, base):
        return (False, None, None, 0, *history, None, None)
    shape, stride, offset = tuple(leaf.shape), tuple(leaf.stride()), leaf.storage_offset() - base.storage_offset()
    if not any(isinstance(v, torch.SymInt) for v in (*shape, *stride, offset)):
        return (False, shape, stride, offset, *history, None, None)
    evaluate = _size_function((*shape, *stride, offset), size_sources, "an output that views another tensor")
    n = len(shape)
    return (False, None, None, 0, *history, lambda flat: _split_geometry(evaluate(flat), n), None)


def _reinterpreting_geometry(leaf: torch.Tensor, base: torch.Tensor, history: tuple) -> tuple:
    """`_geometry` of a view reading `base`'s storage as another dtype: shape, stride and offset in `leaf`'s
    elements, the offset from where `base` starts (see `_reinterpreted`)."""
    if leaf.requires_grad and not (_is_complex_of(leaf.dtype, base.dtype) or _is_complex_of(base.dtype, leaf.dtype)):
        # only view_as_complex / view_as_real carry a gradient across dtypes (see `_reinterpreting_view`)
        raise KilnLimit("kiln: an output that views a tensor requiring grad as another dtype "
                                  "(view_as_complex, view_as_real)")
    geometry = (*leaf.shape, *leaf.stride(), leaf.storage_offset(), base.storage_offset())
    if any(isinstance(v, torch.SymInt) for v in geometry):
        raise NeedsStaticShapes("an output that views another tensor as another dtype")
    start = base.storage_offset() * base.dtype.itemsize // leaf.dtype.itemsize
    return (False, tuple(leaf.shape), tuple(leaf.stride()), leaf.storage_offset() - start, *history, None, leaf.dtype)


def _split_geometry(values: tuple, ndim: int) -> tuple:
    return values[:ndim], values[ndim:2 * ndim], values[-1]


def _size_function(values: tuple, size_sources: dict, what: str) -> Callable:
    """flat inputs -> `values` (ints, SymInts) for this call's sizes: each symbol read off the input
    dimension it is the size of, the expressions then computed as Python code."""
    exprs = [sympy.sympify(_expr(v)) for v in values]
    symbols = set().union(*(e.free_symbols for e in exprs))
    if not symbols <= size_sources.keys():
        raise NeedsStaticShapes(f"{what} with sizes no input dimension carries")
    lines = ["def sizes(flat):"] + [f"    {sym} = flat[{i}]" + ("" if d is None else f".size({d})") for sym, (i, d) in
                                    ((sym, size_sources[sym]) for sym in sorted(symbols, key=str))]
    lines.append(f"    return ({''.join(size_source(e) + ', ' for e in exprs)})")
    namespace: dict = {}
    exec("\n".join(lines), dict(SIZE_NAMES), namespace)
    return namespace["sizes"]


def _version_of(t: torch.Tensor) -> int | None:
    """`t`'s version counter, or None for an inference tensor (it has none: made under inference_mode)."""
    return None if t.is_inference() else t._version


def _geometry_of(t: torch.Tensor) -> tuple:
    """(shape, stride, storage offset), symbolic sizes as expressions (comparing them adds no guard)."""
    return _geometry_expressions(t.shape, t.stride(), t.storage_offset())


def _geometry_expressions(shape, stride, offset) -> tuple:
    """Sizes, strides and offset as expressions, under the size replacements known now."""
    return tuple(map(_expr, shape)), tuple(map(_expr, stride)), _expr(offset)


def _expr(v):
    return v.node.expr if isinstance(v, torch.SymInt) else v


def _same_geometry(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtypes, sizes, strides and offset, compared as expressions (no size guard is added)."""
    if a.dtype != b.dtype:
        return False
    ga = [_expr(v) for v in (*a.shape, *a.stride(), a.storage_offset())]
    gb = [_expr(v) for v in (*b.shape, *b.stride(), b.storage_offset())]
    return a.dim() == b.dim() and ga == gb


def _covers(base: torch.Tensor, leaf: torch.Tensor) -> bool:
    """Whether every element of `leaf` lies within `base`'s extent of their common storage."""
    if any(isinstance(v, torch.SymInt) for v in (*leaf.shape, *leaf.stride(), leaf.storage_offset())):
        if leaf._base is base:  # a view lies within its base, whatever the sizes
            return True
        raise NeedsStaticShapes("outputs sharing storage, not views of one base, with symbolic sizes")
    if leaf.numel() == 0:
        return True
    low, high = _extent(base)
    leaf_low, leaf_high = _extent(leaf)
    return low <= leaf_low and leaf_high <= high


def _extent(t: torch.Tensor) -> tuple:
    """The first and last byte `t` reads of its storage (in bytes: views of one storage may differ in dtype)."""
    start = t.storage_offset()
    last = start + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start * t.dtype.itemsize, (last + 1) * t.dtype.itemsize - 1


def symbolic_dispatch(mode: FakeTensorMode):
    """With symbolic sizes, composite ops (F.linear, F.pad, ...) must decompose in Python,
    where sizes stay symbols: their C++ versions read concrete sizes and fail or specialize."""
    return enable_python_dispatcher() if mode.shape_env is not None else contextlib.nullcontext()


def _symbolic_fake_mode(gm: torch.fx.GraphModule) -> FakeTensorMode | None:
    """The fake mode of `gm`'s placeholders if some of their sizes are symbolic or some are symbolic ints (a
    mode over the ints' shape environment where no tensor input has one), else None."""
    values = [_example(node) for node in gm.graph.find_nodes(op="placeholder")]
    mode = next((v.fake_mode for v in values if isinstance(v, torch.Tensor) and any(
        isinstance(s, torch.SymInt) for s in v.shape)), None)
    symint = next((v for v in values if is_symbolic_int(v)), None)
    if mode is None and symint is not None:
        shape_env = symint.node.shape_env
        mode = next((v.fake_mode for v in values if isinstance(v, FakeTensor) and v.fake_mode.shape_env is shape_env),
                    None) or FakeTensorMode(shape_env=shape_env)
    if mode is not None:
        mode.allow_non_fake_inputs = True  # tensor constants of the graph are real
    return mode

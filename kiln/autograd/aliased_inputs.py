"""Graphs called with inputs that share storage, one of which the graph writes in place.

`f(a, b)` with `a.add_(1); return a + b`, called as `f(x, x)` or `f(x, x[:3])`: eager's `a + b`
reads the written values through `b`. The ATen graphs are traced on one fake tensor per input,
each with storage of its own, so functionalization would turn the write into a copy that `b`
never sees. Here such a graph is rewritten before it is compiled: each group of inputs on one
storage becomes one *base* input (a 1-D view of the storage span the group covers), and each
member a view of it taken at the top of the graph. Writes through any member are then writes to
the base, which functionalization sees as such and copies back into the real storage.

Members may differ in dtype (`x` and `x.view(torch.int32)`) and in requires_grad (`x` and `x.detach()[:2]`):
the members that require grad view the base, which carries their gradients; the others view its detached
alias, reinterpreting its bytes where their dtype is another, so that writes through them are, as in eager,
no autograd op, and what the others read after them. What one base cannot hold (an expanded leaf that requires
grad, two such leaves on one storage, a member narrower than the base's dtype in parts of its elements) runs
as captured, op by op, a counted fallback (`_group` says why).

Which inputs share storage, and at what storage offsets, is fixed for a compiled graph: the
capture guards it (`capture/guards.py`, the "input aliasing" guard) where the graph writes an
input. Inputs that share storage but are only read need nothing of this (tied weights).
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from kiln import fallbacks
from kiln.autograd.decompositions import FILLS
from kiln.autograd.functionalize import IN_PLACE_VIEWS
from kiln.autograd.history import reachable_nodes
from kiln.autograd.signature import TensorSpec
from kiln.autograd.view_replay import ViewRecorder
from kiln.effects import written_arguments


@dataclass(frozen=True)
class AliasGroup:
    """Inputs `members` (positions) on one storage, rebuilt in the graph as views of one base: a 1-D tensor of
    `dtype` over the storage's first `extent` elements of that dtype. Each member is a view of it at the member's
    geometry (its storage offset included) at compile time.

    The base starts where the storage does: `as_strided` takes offsets from the storage's start,
    so with a base at offset 0 the graph's views mean the same whoever runs them.

    The base is taken from `source` (a member's position in the group, or `ROOT`: the tensor the members that
    require grad view) and carries the gradients of the members that require grad (`detached[k]` False). Each
    other member is a view of the detached base, as a member of another dtype (`x.view(torch.int16)`) or one
    that requires no grad beside members that do (`x.detach()[:2]`) is in eager: writes through it are no
    autograd op, and change the values the others read."""

    members: tuple[int, ...]
    extent: int
    dtype: torch.dtype
    detached: tuple[bool, ...]
    source: int | str


ROOT = "root"


def written_alias_groups(gm: fx.GraphModule, example_inputs: list) -> list[AliasGroup] | str:
    """The groups of inputs that share a storage the graph writes; [] if none needs rewriting; where one base
    cannot hold some group, why not (`_group`): the graph then runs as it is."""
    groups = _storage_groups(example_inputs)
    if not groups and not _may_write_through_overlap(gm):
        return []
    writes = _input_writes(gm, example_inputs)
    if writes is not None:  # else a write is assumed, which is compiled soundly either way
        written, through_overlap = writes
        grouped = {i for g in groups for i in g}
        groups += [[i] for i in sorted(through_overlap - grouped)]
        # a group none of whose members the graph writes is only read (tied weights, an expanded input): as it is
        groups = [g for g in groups if written & set(g)]
    built = [_group(g, [example_inputs[i] for i in g]) for g in groups]
    if any(isinstance(b, str) for b in built):
        built = _without_unreached_leaves(gm, example_inputs, groups, built)
    unholdable = [b for b in built if isinstance(b, str)]
    return unholdable[0] if unholdable else built


def _without_unreached_leaves(gm: fx.GraphModule, inputs: list, groups: list[list[int]],
                              built: list[AliasGroup | str]) -> list[AliasGroup | str]:
    """`built`, with each group no base could hold built again as if its leaves that require grad did not, where the
    graph gives them no gradient: no output's (nor written input's) history reaches them (`_reached_leaves`).

    Such a leaf is written only where autograd records nothing (`torch.nn.init.zeros_` of an expanded leaf), so
    as a view of the detached base it reads and writes what eager's does, and nothing else of it is observable."""
    leaves = {i for g, b in zip(groups, built) if isinstance(b, str) for i in g
              if inputs[i].requires_grad and inputs[i].is_leaf}
    reached = _reached_leaves(gm, inputs, leaves)
    if reached is None or reached == leaves:
        return built
    return [_group(g, [inputs[i] for i in g], ignored={k for k, i in enumerate(g) if i in leaves - reached})
            if isinstance(b, str) else b for g, b in zip(groups, built)]


def _reached_leaves(gm: fx.GraphModule, inputs: list, leaves: set[int]) -> set[int] | None:
    """Those of `leaves` (inputs that are leaves requiring grad) whose gradient one run of `gm` in grad mode on fake
    copies of `inputs` could reach: from its outputs, or from inputs it gave history. None where the run cannot tell
    (an op the fake run cannot do, a write autograd refuses, a leaf not copied as a leaf)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in inputs]
    if any(not (fakes[i].is_leaf and fakes[i].requires_grad) for i in leaves):
        return None
    try:
        with mode, torch.enable_grad():
            out = gm(*fakes)
            # a view's grad_fn is rebuilt here where its base was written since, which autograd may refuse (an
            # internal assert on CUDA fakes of a view written under no_grad)
            roots = [t.grad_fn for t in (*pytree.tree_leaves(out), *fakes)
                     if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    except Exception:  # noqa: BLE001 -- an op the fake run cannot do, or a write to a leaf eager refuses too
        return None
    accumulated = {id(v) for v in _accumulated_variables(roots)}
    return {i for i in leaves if id(fakes[i]) in accumulated}


def _accumulated_variables(roots: list) -> list[torch.Tensor]:
    """The leaves whose gradient accumulators the autograd graphs of `roots` reach."""
    return [node.variable for node in reachable_nodes(roots) if hasattr(node, "variable")]


def _storage_groups(inputs: list) -> list[list[int]]:
    by_storage: dict[StorageWeakRef, list[int]] = {}
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
            by_storage.setdefault(StorageWeakRef(t.untyped_storage()), []).append(i)
    # an input whose elements share memory (an expanded one) is a group of its own: written through a view
    # (`a[0] = 1`), its new value is the written storage's, which no tensor of its geometry can be copied from
    return [g for g in by_storage.values() if len(g) > 1 or TensorSpec.of(inputs[g[0]]).overlapping]


def _input_writes(gm: fx.GraphModule, inputs: list) -> tuple[set[int], set[int]] | None:
    """(the inputs whose data one run of `gm` on fake copies of `inputs` (their storage sharing kept) writes, those
    of them written through a view whose elements share memory); None if the plain fake run cannot do some op.

    An input written through such a view (`x.expand(3, n)[1].copy_(v)`) gets a base of its own: the write is
    then one `as_strided` view of the base (functionalize.py, `_writes_through_overlaps`), which keeps
    the written values exactly. An in-place view op (`b.t_()`) changes only its input's geometry, which the
    runtime gives the input after the call (`restride_inputs`) with no base needed."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in inputs]
    views = ViewRecorder()
    writes = _DataWrites(views)
    try:
        with mode, views, writes, torch.no_grad():
            gm(*fakes)
    except Exception:  # noqa: BLE001 -- an op the plain fake run cannot do
        return None
    positions: dict[StorageWeakRef, list[int]] = {}
    for i, f in enumerate(fakes):
        if isinstance(f, torch.Tensor):
            positions.setdefault(StorageWeakRef(f.untyped_storage()), []).append(i)
    return ({i for s in writes.storages for i in positions.get(s, ())},
            {i for s in writes.through_overlap for i in positions.get(s, ())})


# view ops (torch functions and tensor methods, as a captured graph calls them) whose result may share memory
# between its elements, and so let a write through a view of it need a base (`_input_writes`)
_OVERLAPPING_VIEWS = {"expand", "expand_as", "broadcast_to", "broadcast_tensors", "as_strided", "unfold"}


def _may_write_through_overlap(gm: fx.GraphModule) -> bool:
    """Could `gm` write through a view with overlap: does it call both an overlapping view op and an in-place op?
    A cheap look at the calls, so that only such graphs pay for a fake run (`_input_writes`): a warm start pays
    for that run too (nothing of it is cached), so an op that is not in place must not count as one."""
    calls = [n for n in gm.graph.nodes if n.op in ("call_method", "call_function")]
    return bool({_called_name(n) for n in calls} & _OVERLAPPING_VIEWS) and writes_an_input(gm)


def writes_an_input(gm: fx.GraphModule) -> bool:
    """Could one of `gm`'s in-place calls (`in_place_call`) write the storage of an input? Not where the tensor
    each writes is one the graph made: its value at capture (`example_value`) on a storage no input's value is on
    (a decoder input built with `ids.new_zeros(...)` and written by slices; a mask filled in place). A graph of such
    writes alone pays no fake run to find its input writes (a warm start pays that run too)."""
    inputs = set()
    for p in gm.graph.find_nodes(op="placeholder"):
        value = p.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            inputs.add(StorageWeakRef(value.untyped_storage()))
        elif "example_value" not in p.meta:
            return any(in_place_call(n) for n in gm.graph.nodes if n.op in ("call_method", "call_function"))
    for n in gm.graph.nodes:
        if n.op in ("call_method", "call_function") and in_place_call(n):
            written = n.args[0] if n.args else None
            value = written.meta.get("example_value") if isinstance(written, fx.Node) else None
            if not isinstance(value, torch.Tensor) or StorageWeakRef(value.untyped_storage()) in inputs:
                return True
    return False


# Python's operators that write their left operand (`x += y`, `x[i] = y`), as functions and as methods. The
# operator module's other names are not in place, whatever their spelling (`&` is `operator.and_`).
_IN_PLACE_OPERATORS = frozenset({operator.setitem, operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift,
                                 operator.imatmul, operator.imod, operator.imul, operator.ior, operator.ipow,
                                 operator.irshift, operator.isub, operator.itruediv, operator.ixor})
_IN_PLACE_DUNDERS = frozenset(f"__{op.__name__}__" for op in _IN_PLACE_OPERATORS)


def in_place_call(node: fx.Node) -> bool:
    """Could this call write an argument in place: one of Python's in-place operators, or a torch method or
    function named in place (`add_`, `torch.relu_`, `torch.nn.init.zeros_`)?"""
    if node.op == "call_function" and getattr(node.target, "__module__", None) in ("operator", "_operator"):
        return node.target in _IN_PLACE_OPERATORS
    name = _called_name(node)
    return name in _IN_PLACE_DUNDERS or (name.endswith("_") and not name.startswith("_"))


def _called_name(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


# in-place ops that change their input's geometry and not its data (ATen's schemas mark them as writes)
GEOMETRY_ONLY = {op.overloadpacket for op in IN_PLACE_VIEWS}


class _DataWrites(TorchDispatchMode):
    """The storages whose data an op writes (in place, or as an `out=` argument), and those of them written
    through a view whose elements share memory (by the views `views` recorded). A fill (`FILLS`) into such a view
    itself counts: tracing makes it a fill of the memory seen once, a view of the view (decompositions.py)."""

    def __init__(self, views: ViewRecorder):
        super().__init__()
        self.views = views
        self.storages: set[StorageWeakRef] = set()
        self.through_overlap: set[StorageWeakRef] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket not in GEOMETRY_ONLY:
            for value in written_arguments(func._schema, args, kwargs):
                if isinstance(value, torch.Tensor):
                    self._written(value, func in FILLS)
        return func(*args, **kwargs)

    def _written(self, t: torch.Tensor, fill: bool) -> None:
        storage = StorageWeakRef(t.untyped_storage())
        self.storages.add(storage)
        if any(TensorSpec.of(v).overlapping for v in [t] * fill + self.views.ancestors(t)):
            self.through_overlap.add(storage)


def _fake_run(gm: fx.GraphModule, inputs: list, positions: set[int]) -> dict[int, tuple[bool, tuple]] | None:
    """Per input of `positions`: (written in place, geometry after) in one run of `gm` on fake copies of
    `inputs` (their storage sharing kept); None if the plain fake run cannot do some op."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in inputs]
    versions = {i: fakes[i]._version for i in positions}
    try:
        with mode, torch.no_grad():
            gm(*fakes)
    except Exception:  # an op the plain fake run cannot do: assume a write, which is compiled soundly either way
        return None
    return {i: (fakes[i]._version != v, _geometry(fakes[i])) for i, v in versions.items()}


def _geometry(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def _group(members: list[int], tensors: list[torch.Tensor], ignored: set[int] = frozenset()) -> AliasGroup | str:
    """The base and views that hold `tensors` (inputs `members`), or why none can.

    The members that require grad get their gradients through the base, so they must agree on where it goes:
    one dtype (the base's), and either a member whose elements hold all of theirs or one tensor they all view with
    autograd history (`_gradient_source`). A leaf that requires grad gets a gradient per element of its own shape:
    through a base it reaches the storage, which is the same only where the leaf's elements share no memory and no
    second leaf shares them. With no member that requires grad, the base has the smallest itemsize, which every
    member's bytes are whole elements of. `ignored`: members that require grad and get none from the graph
    (`_without_unreached_leaves`), held as if they did not."""
    grads = [k for k, t in enumerate(tensors) if t.requires_grad and k not in ignored]
    if grads:
        if len({tensors[k].dtype for k in grads}) > 1:
            return "members that require grad have different dtypes"
        source = _gradient_source(tensors, grads)
        if isinstance(source, str) and source != ROOT:
            return source
        dtype = tensors[grads[0]].dtype
    else:
        source = min(range(len(tensors)), key=lambda k: tensors[k].element_size())
        dtype = tensors[source].dtype
    itemsize = dtype.itemsize
    end = max(_end_byte(t) for t in tensors)
    extent = -(-end // itemsize)
    if extent * itemsize > tensors[0].untyped_storage().nbytes():
        return f"the members' bytes end inside an element of the base's {dtype}, at the storage's end"
    if any(_in_base_units(t, dtype) is None for t in tensors):
        return f"a member's elements are parts of elements of the base's {dtype} (the members that require grad)"
    detached = tuple(t.dtype != dtype or k not in grads and (bool(grads) or t.requires_grad)
                     for k, t in enumerate(tensors))
    return AliasGroup(tuple(members), extent, dtype, detached, source)


def _end_byte(t: torch.Tensor) -> int:
    """The byte just past `t`'s last element in its storage (where it starts, if it has none)."""
    if not t.numel():
        return t.storage_offset() * t.element_size()
    return (t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _gradient_source(tensors: list[torch.Tensor], grads: list[int]) -> int | str:
    """Where the base of a group takes its history from: the position of the member that requires grad whose
    elements hold those of every other such member, or `ROOT` where they all view one tensor that requires grad
    through views with history (or are it); else why neither is sound.

    A view's backward gives a gradient only to the elements of the tensor it views: a base taken from one member
    would drop the gradient of every element the other members read beyond it (`b = a[1:]`, `c = b[::2]`:
    `b.sum()` through a base of `c` reached only `c`'s rows)."""
    leaves = [k for k in grads if tensors[k].is_leaf]
    if any(TensorSpec.of(tensors[k]).overlapping for k in leaves):
        return "an expanded leaf that requires grad: its gradient is one value per element, not per storage place"
    if len(leaves) > 1:
        return "two leaves that require grad share the storage: each gets a gradient of its own"
    if len(grads) == 1:
        return grads[0]
    if not leaves:
        covering = _covering_member([tensors[k] for k in grads])
        if covering is not None:
            return grads[covering]
    if _views_of_one_root([tensors[k] for k in grads]):
        return ROOT
    return "members that require grad are not views of one tensor, and none holds the others' elements"


def _views_of_one_root(tensors: list[torch.Tensor]) -> bool:
    """Whether `tensors` all view one tensor that requires grad through views with history, or are it."""
    root = _root(tensors)
    return root.requires_grad and all(t is root or (t._base is root and t.grad_fn is not None) for t in tensors)


def _root(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0]._base if tensors[0]._base is not None else tensors[0]


def _covering_member(tensors: list[torch.Tensor]) -> int | None:
    """The position of the one of `tensors` (of one dtype, on one storage) whose elements include every other's
    (their geometry is guarded: fixed for the compiled graph), or None."""
    extent = max(_end_byte(t) for t in tensors) // tensors[0].element_size()
    marks = []
    for t in tensors:
        mark = torch.zeros(extent, dtype=torch.bool)
        mark.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(True)
        marks.append(mark)
    union = torch.stack(marks).any(0)
    return next((k for k, mark in enumerate(marks) if torch.equal(mark, union)), None)


def _key(args) -> tuple:
    """What a rewrite depends on besides which inputs alias and where (the capture guards that): the geometry (per
    shape, the views are static), and which inputs require grad (guarded by kiln's capture, not by every caller of
    a backend) and are leaves."""
    return tuple((tuple(a.shape), a.stride(), a.requires_grad, a.is_leaf) if isinstance(a, torch.Tensor) else None
                 for a in args)


class AliasedInputsCompiled:
    """`gm` compiled per input shape for the aliasing of its inputs: with a base input per storage
    where the graph writes one of several inputs on it, as it is where none is, and run op by op
    where one base cannot hold them (`written_alias_groups`): correct, not compiled, so a fallback
    (kiln.fallbacks) of graph `name`. Per shape, since the views of the bases are taken at each shape's
    geometry (the capture guards the aliasing itself)."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list, compile: Callable[[fx.GraphModule, list], Callable],
                 name: str):
        self.gm, self.compile, self.name = gm, compile, name
        self.compiled: dict[tuple, Callable] = {}
        self._for(example_inputs)

    def _for(self, args) -> Callable:
        key = _key(args)
        if key not in self.compiled:
            groups = written_alias_groups(self.gm, list(args))
            if isinstance(groups, str):
                self.compiled[key] = self._as_captured(groups)
            elif groups:
                self.compiled[key] = SyntheticBases(self.gm, list(args), groups, self.compile)
            else:
                self.compiled[key] = self.compile(self.gm, list(args))
        return self.compiled[key]

    def _as_captured(self, why: str) -> Callable:
        fallbacks.record("graph", self.name, f"inputs share a storage the graph writes, and no one base input can "
                         f"hold them ({why}); the captured graph runs op by op", stage="autograd")
        return self.gm

    def __call__(self, *args):
        compiled = self._for(args)
        if isinstance(compiled, SyntheticBases) and not compiled.holds(args):
            return self._as_captured("members that require grad are not views of one tensor")(*args)
        return compiled(*args)


class SyntheticBases:
    """A graph whose aliased inputs become views of one base input each, compiled by `compile`."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list, groups: list[AliasGroup],
                 compile: Callable[[fx.GraphModule, list], Callable]):
        self.groups = groups
        member_of = {i: (g, k) for g in groups for k, i in enumerate(g.members)}
        self.kept = [i for i in range(len(example_inputs)) if i not in member_of]
        self.returned_inputs = _returned_placeholders(gm, set(member_of))
        self.restrided = _restrided(gm, example_inputs, set(member_of))
        self.rooted = [g for g in groups if g.source == ROOT]
        self.compiled = compile(_rewrite(gm, groups, example_inputs), self.inputs(example_inputs))

    def holds(self, args) -> bool:
        """Whether the members that require grad still view one tensor where the base is taken from it (which
        tensor a view's `_base` is, the capture does not guard)."""
        return all(_views_of_one_root([args[i] for i, d in zip(g.members, g.detached) if not d]) for g in self.rooted)

    def inputs(self, args) -> list:
        """The rewritten graph's inputs: the unaliased ones, then one base per group."""
        return [args[i] for i in self.kept] + [_base(args, g) for g in self.groups]

    def __call__(self, *args):
        out = self.compiled(*self.inputs(args))
        if self.restrided:  # in the graph, the view of the base took the new geometry, not the input
            with torch.no_grad():
                for i, (shape, stride, offset) in self.restrided:
                    args[i].as_strided_(shape, stride, args[i].storage_offset() + offset)
        if self.returned_inputs:  # `return a`: eager returns the input itself, not a view of the base
            out = list(out)
            for position, i in self.returned_inputs:
                out[position] = args[i]
            out = tuple(out)
        return out


def _base(args, group: AliasGroup) -> torch.Tensor:
    """The group's base, under autograd: a view of the tensor its gradients go to (`AliasGroup.source`); where
    no member carries a gradient, of its detached alias (an unreached leaf's history stays out of the graph)."""
    if group.source == ROOT:
        source = _root([args[i] for i, d in zip(group.members, group.detached) if not d])
    else:
        source = args[group.members[group.source]]
    if all(group.detached[k] or not args[i].requires_grad for k, i in enumerate(group.members)):
        source = source.detach()
    return source.as_strided((group.extent,), (1,), 0)


def _restrided(gm: fx.GraphModule, example_inputs: list, members: set[int]) -> list[tuple[int, tuple]]:
    """(input, new geometry) for the aliased inputs whose geometry an in-place view op of the graph
    (`t_`, `unsqueeze_`, `as_strided_`) changes: eager's input has it after the call. The storage
    offset is relative to the input's, as the runtime applies it."""
    changes = _fake_run(gm, example_inputs, members) or {}
    before = {i: _geometry(example_inputs[i]) for i in changes}
    return [(i, (shape, stride, offset - before[i][2])) for i, (_, (shape, stride, offset)) in sorted(changes.items())
            if (shape, stride, offset) != before[i]]


def _returned_placeholders(gm: fx.GraphModule, members: set[int]) -> list[tuple[int, int]]:
    """(output position, input) for the graph's outputs that are aliased inputs themselves."""
    placeholders = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    result = gm.graph.find_nodes(op="output")[0].args[0]
    if not isinstance(result, (tuple, list)):
        return []
    return [(k, placeholders[n]) for k, n in enumerate(result) if n in placeholders and placeholders[n] in members]


def _rewrite(gm: fx.GraphModule, groups: list[AliasGroup], example_inputs: list) -> fx.GraphModule:
    """`gm` taking (unaliased inputs, bases), each aliased input an `as_strided` view of its base (`_member`).

    Placeholders keep no fake values: the rewritten graph compiles per input shape (sizes the
    capture left symbolic are then static), since the views' geometry is its own."""
    member_of = {i: (g, k) for g, group in enumerate(groups) for k, i in enumerate(group.members)}
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    for i, node in enumerate(placeholders):
        if i not in member_of:
            env[node] = graph.placeholder(node.name)
    bases = [graph.placeholder(f"aliased_base_{g}") for g in range(len(groups))]
    for i, node in enumerate(placeholders):
        if i in member_of:
            g, k = member_of[i]
            env[node] = _member(graph, bases[g], groups[g], k, example_inputs[i])
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(gm, graph)


def _member(graph: fx.Graph, base: fx.Node, group: AliasGroup, k: int, t: torch.Tensor) -> fx.Node:
    """Member `k` of `group` (the input `t`) as a view of the base: one `as_strided` of the base first (a write
    through a view chain with `as_strided` further down cannot be made functional), then, where eager's writes
    through the member are no autograd op, its detached alias, and, where its dtype is another, its bytes
    reinterpreted (`view(dtype)`, `_in_base_units`)."""
    shape, stride, offset, wider = _in_base_units(t, group.dtype)
    member = graph.call_function(torch.as_strided, (base, shape, stride, offset))
    if group.detached[k]:
        member = graph.call_method("detach", (member,))
    if t.dtype != group.dtype:
        member = graph.call_method("view", (member, t.dtype))
        if wider:
            member = graph.call_method("select", (member, -1, 0))
    return member


def _in_base_units(t: torch.Tensor, dtype: torch.dtype) -> tuple[tuple, tuple, int, bool] | None:
    """(shape, stride, storage offset) of the tensor of `dtype` whose bytes `t` reinterprets, and whether it has one
    more dim than `t` (`t`'s elements wider, and not contiguous along its last dim: the new dim holds the elements
    making one of `t`'s, and `_member` selects its first after the reinterpretation; squeezing it instead left a
    size-1 dim whose stride the inverse of `view(dtype)` refused in the compiled complex case); None where no such
    tensor exists (`t` narrower, its elements not whole elements of `dtype`). Itemsizes are powers of two."""
    shape, stride, offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()
    if t.element_size() >= dtype.itemsize:
        r = t.element_size() // dtype.itemsize
        if r == 1:
            return shape, stride, offset, False
        if shape and stride[-1] == 1:  # its last dim's elements are runs of the base's
            return shape[:-1] + (shape[-1] * r,), tuple(st * r for st in stride[:-1]) + (1,), offset * r, False
        return shape + (r,), tuple(st * r for st in stride) + (1,), offset * r, True
    r = dtype.itemsize // t.element_size()
    if not shape or stride[-1] != 1 or shape[-1] % r or offset % r or any(st % r for st in stride[:-1]):
        return None
    return shape[:-1] + (shape[-1] // r,), tuple(st // r for st in stride[:-1]) + (1,), offset // r, False

"""Graphs called with inputs that share storage, one of which the graph writes in place.

`f(a, b)` with `a.add_(1); return a + b`, called as `f(x, x)` or `f(x, x[:3])`: eager's `a + b`
reads the written values through `b`. The ATen graphs are traced on one fake tensor per input,
each with storage of its own, so functionalization would turn the write into a copy that `b`
never sees. Here such a graph is rewritten before it is compiled: each group of inputs on one
storage becomes one *base* input (a 1-D view of the storage span the group covers), and each
member a view of it taken at the top of the graph. Writes through any member are then writes to
the base, which functionalization sees as such and copies back into the real storage.

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
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from kiln import fallbacks
from kiln.autograd.functionalize import IN_PLACE_VIEWS
from kiln.autograd.signature import TensorSpec
from kiln.autograd.view_replay import ViewRecorder


@dataclass(frozen=True)
class AliasGroup:
    """Inputs `members` (positions) on one storage: the base spans its first `extent` elements, and
    member k starts `offsets[k]` elements into it (its storage offset).

    The base starts where the storage does: `as_strided` takes offsets from the storage's start,
    so with a base at offset 0 the graph's views mean the same whoever runs them."""

    members: tuple[int, ...]
    offsets: tuple[int, ...]
    extent: int


def written_alias_groups(gm: fx.GraphModule, example_inputs: list) -> list[AliasGroup] | None:
    """The groups of inputs that share storage if the graph writes one of them; [] if none needs
    rewriting; None if some cannot be: run the graph as it is. One base cannot hold members of different
    dtypes, nor members that require grad and members that do not (`b = a.detach()[:2]`: eager's writes
    through b are no autograd op, where writes through a view of a's base would be one on a leaf's view), nor a
    leaf that requires grad (`_owns_its_gradient`)."""
    groups = _storage_groups(example_inputs)
    if not groups and not _may_write_through_overlap(gm):
        return []
    writes = _input_writes(gm, example_inputs)
    if writes is not None:  # else a write is assumed, which is compiled soundly either way
        written, through_overlap = writes
        grouped = {i for g in groups for i in g}
        groups += [[i] for i in sorted(through_overlap - grouped)]
        if not written & {i for g in groups for i in g}:
            return []
    if not groups:
        return []
    tensors = [[example_inputs[i] for i in g] for g in groups]
    if any(len({t.dtype for t in ts}) > 1 or len({t.requires_grad for t in ts}) > 1 for ts in tensors):
        return None
    if any(_owns_its_gradient(t) for ts in tensors for t in ts):
        return None
    return [_group(g, ts) for g, ts in zip(groups, tensors)]


def _owns_its_gradient(t: torch.Tensor) -> bool:
    """A leaf that requires grad: eager gives it a gradient of its own shape, one value per element, whatever
    memory its elements share with each other (an expanded leaf) or with other inputs. Through a base, the
    gradient would reach the storage: an expanded leaf's elements would get the mean of theirs, and a second
    leaf on the storage none. Eager writes such a leaf only where no gradient is recorded (`no_grad`, `.data`)."""
    return t.requires_grad and t.is_leaf


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
    return bool({_called_name(n) for n in calls} & _OVERLAPPING_VIEWS) and any(map(_in_place, calls))


# Python's operators that write their left operand (`x += y`, `x[i] = y`), as functions and as methods. The
# operator module's other names are not in place, whatever their spelling (`&` is `operator.and_`).
_IN_PLACE_OPERATORS = frozenset({operator.setitem, operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift,
                                 operator.imatmul, operator.imod, operator.imul, operator.ior, operator.ipow,
                                 operator.irshift, operator.isub, operator.itruediv, operator.ixor})
_IN_PLACE_DUNDERS = frozenset(f"__{op.__name__}__" for op in _IN_PLACE_OPERATORS)


def _in_place(node: fx.Node) -> bool:
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
    through a view whose elements share memory (by the views `views` recorded)."""

    def __init__(self, views: ViewRecorder):
        super().__init__()
        self.views = views
        self.storages: set[StorageWeakRef] = set()
        self.through_overlap: set[StorageWeakRef] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket not in GEOMETRY_ONLY:
            for k, arg in enumerate(func._schema.arguments):
                value = args[k] if k < len(args) else kwargs.get(arg.name)
                if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                    self._written(value)
        return func(*args, **kwargs)

    def _written(self, t: torch.Tensor) -> None:
        storage = StorageWeakRef(t.untyped_storage())
        self.storages.add(storage)
        if any(TensorSpec.of(v).overlapping for v in self.views.ancestors(t)):
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


def _group(members: list[int], tensors: list[torch.Tensor]) -> AliasGroup:
    end = max(t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) for t in tensors)
    return AliasGroup(tuple(members), tuple(t.storage_offset() for t in tensors), end + 1)


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
        key = tuple((tuple(a.shape), a.stride(), _owns_its_gradient(a)) if isinstance(a, torch.Tensor) else None
                    for a in args)
        if key not in self.compiled:
            groups = written_alias_groups(self.gm, list(args))
            if groups is None:
                fallbacks.record("graph", self.name, "inputs share a storage the graph writes, and no one base input "
                                 "can hold them (different dtypes or requires_grad, or a leaf that requires grad); "
                                 "the captured graph runs op by op", stage="autograd")
                self.compiled[key] = self.gm
            elif groups:
                self.compiled[key] = SyntheticBases(self.gm, list(args), groups, self.compile)
            else:
                self.compiled[key] = self.compile(self.gm, list(args))
        return self.compiled[key]

    def __call__(self, *args):
        return self._for(args)(*args)


class SyntheticBases:
    """A graph whose aliased inputs become views of one base input each, compiled by `compile`."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list, groups: list[AliasGroup],
                 compile: Callable[[fx.GraphModule, list], Callable]):
        self.groups = groups
        member_of = {i: (g, k) for g in groups for k, i in enumerate(g.members)}
        self.kept = [i for i in range(len(example_inputs)) if i not in member_of]
        self.returned_inputs = _returned_placeholders(gm, set(member_of))
        self.covering = [_covering_member(example_inputs, g) for g in groups]
        self.restrided = _restrided(gm, example_inputs, set(member_of))
        self.compiled = compile(_rewrite(gm, groups, example_inputs), self.inputs(example_inputs))

    def inputs(self, args) -> list:
        """The rewritten graph's inputs: the unaliased ones, then one base per group."""
        bases = [_spanning(args, g.members, covering).as_strided((g.extent,), (1,), 0)
                 for g, covering in zip(self.groups, self.covering)]
        return [args[i] for i in self.kept] + bases

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


def _spanning(args, members: tuple[int, ...], covering: int | None) -> torch.Tensor:
    """The tensor to take a group's base from, under autograd. A view's backward gives a gradient only to the
    elements of the tensor it views: a base taken from one member would drop the gradient of every element the
    other members read beyond it (`b = a[1:]`, `c = b[::2]`: `b.sum()` through a base of `c` reached only `c`'s
    rows). So: the member whose elements hold every member's (`covering`, by position in the group); else, where
    the members all view one tensor that requires grad through views with autograd history (or are that tensor),
    that tensor; else the first member."""
    tensors = [args[i] for i in members]
    if covering is not None:
        return tensors[covering]
    root = tensors[0]._base if tensors[0]._base is not None else tensors[0]
    if root.requires_grad and all(t is root or (t._base is root and t.grad_fn is not None) for t in tensors):
        return root
    return tensors[0]


def _covering_member(inputs: list, group: AliasGroup) -> int | None:
    """The position in `group` of a member whose elements include every other member's (their geometry is guarded:
    fixed for the compiled graph), or None."""
    marks = []
    for i in group.members:
        t = inputs[i]
        mark = torch.zeros(group.extent, dtype=torch.bool)
        mark.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(True)
        marks.append(mark)
    union = torch.stack(marks).any(0)
    return next((k for k, mark in enumerate(marks) if torch.equal(mark, union)), None)


def _rewrite(gm: fx.GraphModule, groups: list[AliasGroup], example_inputs: list) -> fx.GraphModule:
    """`gm` taking (unaliased inputs, bases), each aliased input an `as_strided` view of its base.

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
            t = example_inputs[i]
            env[node] = graph.call_function(torch.as_strided, (bases[g], tuple(t.shape), tuple(t.stride()),
                                                               groups[g].offsets[k]))
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(gm, graph)

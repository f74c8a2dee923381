"""Functionalization: in-place ops become pure ops, input mutations become outputs.

The traced ATen graph is re-traced through `torch.func.functionalize`, which
replaces each in-place op by its out-of-place form and, for a graph input that
was mutated, ends the graph with `aten.copy_(input, new_value)`. Those trailing
copies are then taken out of the graph: each `new_value` becomes an extra graph
output, and the runtime copies it into the real input after the call
(`InputMutation`). View ops stay views (`remove="mutations"`): the code
generator lowers them as index rewrites, and a view is cheaper than a copy.

Ops that mutate without a functional variant known to the functionalizer (the
batch-norm family writes its running statistics in place) are decomposed first,
during tracing (`decompositions.FUNCTIONALIZATION`). `verify_functional` checks
the result: no op of the final graph may have a mutable schema.

The re-trace runs every op of the graph on fake tensors once more (as long as the joint
trace itself on models with dropout or batch norm). Where every in-place op writes a
tensor none of whose aliases has a geometry of its own (dropout's `bernoulli_` and
`div_` on a fresh tensor, batch norm's running statistics, `num_batches_tracked += 1`),
or there is none (most inference graphs), functionalization amounts to a rewrite, done
without re-tracing (`_rewrite_writes`): each in-place op becomes its functional
variant, later readers read its result, and each written input gets
`copy_(input, new value)` at the end, as the re-trace records it.
"""
from __future__ import annotations

import copy
import functools
import operator
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.autograd.signature import KilnLimit, NeedsStaticShapes, TensorSpec, symbolic_dispatch
from kiln.autograd.storages import node_storage
from kiln.autograd.written_regions import functionalize_written_region
from kiln.effects import eliminate_dead_code
from kiln.runtime.lazy_graphs import graph_module
from kiln.runtime.symbolic_sizes import has_static_geometry

aten = torch.ops.aten

# in-place view ops: each changes its tensor's geometry, not its data, and has an out-of-place view
IN_PLACE_VIEWS = {
    aten.t_.default: aten.t.default, aten.transpose_.default: aten.transpose.int,
    aten.unsqueeze_.default: aten.unsqueeze.default, aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim, aten.squeeze_.dims: aten.squeeze.dims,
    aten.as_strided_.default: aten.as_strided.default, aten.swapdims_.default: aten.swapdims.default,
    aten.swapaxes_.default: aten.swapaxes.default,
}


@dataclass(frozen=True)
class InputMutation:
    """Graph output `output_index` is the new value of flat input `input_index`."""

    input_index: int
    output_index: int


def functionalize(gm: torch.fx.GraphModule, input_specs: list[TensorSpec],
                  mode: FakeTensorMode | None = None,
                  fresh_outputs: int = 0) -> tuple[torch.fx.GraphModule, list[InputMutation]]:
    """A functional copy of `gm`; input mutations are appended to its outputs.

    Rewritten without tracing where `_rewrite_writes` applies; else, where the written storages are
    the graph's own, with only their nodes re-traced (written_regions.py); otherwise re-traced in
    `mode` (a fresh fake mode by default; a dynamic-shape graph passes the one owning its
    symbols). The first `fresh_outputs` outputs are tensors that eager creates (each on a storage
    of its own): they stay so, though dropping identities may have left them an input or each other
    (`_own_storages`)."""
    gm = _writes_through_overlaps(_views_out_of_place(gm))
    root, graph = gm, _rewrite_writes(gm)
    if graph is None and (region := functionalize_written_region(gm)) is not None:
        root, graph = region
    if graph is None:
        mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [s.fake(mode) for s in input_specs]
        with mode, symbolic_dispatch(mode), torch.no_grad(), torch._C._DisableAutocast():  # casts are ops of `gm`
            root = make_fx(torch.func.functionalize(gm, remove="mutations"))(*fakes)
        graph = root.graph
    mutations = _lift_input_mutations(graph)
    _remove_identities(graph)
    _own_storages(graph, fresh_outputs)
    eliminate_dead_code(graph)
    fgm = graph_module(root, graph)
    verify_functional(fgm)
    return fgm, mutations


def _views_out_of_place(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with each in-place view op of a tensor the graph made (`b[:, ::2].t_()`) as its out-of-place view.

    The trace records a size as read from the tensor it was first seen on, before the op changed that
    tensor's geometry (`sym_size(slice, 1)` for the transposed slice's rows); re-traced as it is, the size
    would be read after the change, from the other dim. The op's own result is the changed tensor, which
    the later ops read: as a new view the change is the same, and the earlier tensor keeps its geometry.
    A graph input keeps its op, also where it reaches the op as the result of in-place ops on it (`c.mul_(2).t_()`,
    or `c.fill_(1)` then `c.t_()`): the caller's tensor gets the new geometry after the call, and the value written
    back into it is the input's final one, viewed as the op leaves it (made out of place, the op changed no
    geometry in the functional graph, and the value written before it was copied into the input as restrided
    after the call: transposed, for a square one)."""
    def of_a_tensor_made_here(node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target in IN_PLACE_VIEWS and _written_tensor(node.args[0]).op != \
            "placeholder"

    if not any(map(of_a_tensor_made_here, gm.graph.nodes)):
        return gm
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for node in gm.graph.nodes:
        if of_a_tensor_made_here(node):
            node.target = IN_PLACE_VIEWS[node.target]
    gm.recompile()
    return gm


def _written_tensor(node: torch.fx.Node) -> torch.fx.Node:
    """The node of the tensor `node` is: itself, or, for the result of an in-place op (which returns the tensor it
    writes, `mul_`, `t_`), that op's first argument's."""
    while _is_write(node) and (node.target in IN_PLACE_VIEWS or out_of_place(node.target) is not None):
        node = node.args[0]
    return node


def _writes_through_overlaps(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with each in-place write into a view taken through a view whose elements share memory (`a[0] = 1` of
    an expanded `a`) made a write into one `as_strided` view of the tensor that owns the memory.

    Functionalization replays a write into a view on each view it was taken from, in reverse: the inverse of
    `as_strided` (`as_strided_scatter`) refuses a view with overlap, and that of `expand` adds the change summed
    over the expanded dimension (`x + sum(new - x)`, which inf, nan and large values do not survive). Eager
    writes the written view's memory, each location once (a written view with overlap raises in eager, which
    eager_errors.py keeps): `as_strided_scatter` of that one view into the owner computes just that.

    The owner is a tensor the graph made, or an input whose chain starts with `as_strided` (the base of
    aliased inputs, aliased_inputs.py): `as_strided` then reads offsets as the graph already does. A chain that
    reinterprets the dtype (`.view(torch.int16)` of a bf16 tensor, `.real` of a complex one) writes the view read
    as the written dtype, so that the value written is the view's, not converted to the owner's (`_direct_view`)."""
    writes = [n for n in gm.graph.nodes if _through_overlap(n)]
    if not writes:
        return gm
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for node in gm.graph.nodes:
        if not _through_overlap(node):
            continue
        target = node.args[0]
        value = target.meta["val"]
        owner = _storage_chain(target)[0]
        with gm.graph.inserting_before(node):
            direct = _direct_view(gm.graph, owner, value)
        node.args = (direct, *node.args[1:])
    gm.recompile()
    return gm


def _direct_view(graph: torch.fx.Graph, owner: torch.fx.Node, value: torch.Tensor) -> torch.fx.Node:
    """`value`'s memory as a view of `owner`'s, `as_strided` first (functionalization replays no write through a
    chain with `as_strided` further down). Of another dtype (`.view(torch.int16)` of a bf16 tensor, `.real` of a
    complex one), the view's geometry counts elements of its own dtype: an owner's element that holds `k` of them
    is viewed with a last dimension of one, read as `k` elements of the view's dtype, and the one at the offset's
    remainder selected. Where the geometry is not whole elements of the owner, the graph raises at its first run
    and the frame runs eagerly (a counted fallback)."""
    def add(op, *args):
        made = graph.call_function(op, args)
        made.meta["val"] = fake_run(op, made)
        return made

    shape, stride, offset = tuple(value.shape), tuple(value.stride()), value.storage_offset()
    k = owner.meta["val"].element_size() // value.element_size()
    if owner.meta["val"].dtype == value.dtype:
        return add(aten.as_strided.default, owner, shape, stride, offset)
    if k > 1 and not any(size > 1 and step % k for size, step in zip(shape, stride)):
        elements = add(aten.as_strided.default, owner, (*shape, 1), (*(step // k for step in stride), 1), offset // k)
        return add(aten.select.int, add(aten.view.dtype, elements, value.dtype), -1, offset % k)
    direct = add(aten.as_strided.default, owner, shape, stride, offset)
    return add(aten.view.dtype, direct, value.dtype) if k == 1 else direct


def _through_overlap(node: torch.fx.Node) -> bool:
    """Is `node` an in-place write (of its first argument) into a view with no overlap of its own, taken from a
    tensor without overlap through a view with overlap (see `_writes_through_overlaps`)? Raises NeedsStaticShapes
    where such a view's geometry is symbolic."""
    if not (_is_write(node) and out_of_place(node.target) and isinstance(node.args[0], torch.fx.Node)):
        return False
    chain = _storage_chain(node.args[0])
    values = [n.meta.get("val") for n in chain]
    if len(chain) < 3 or not all(isinstance(v, torch.Tensor) for v in values):
        return False
    owner = chain[0].op == "call_function" or (chain[0].op == "placeholder"
                                               and chain[1].target is aten.as_strided.default)
    overlapping = [TensorSpec.of(v).overlapping for v in values]
    if not (owner and not overlapping[0] and not overlapping[-1] and any(overlapping[1:-1])):
        return False
    if not has_static_geometry(values[-1]):  # the direct view's geometry is numbers: compiled per shape, it has them
        raise NeedsStaticShapes("a write through a view whose elements share memory, with symbolic sizes")
    return True


def _rewrite_writes(gm: torch.fx.GraphModule) -> torch.fx.Graph | None:
    """The graph `make_fx(functionalize(gm))` records, built by rewriting a copy of `gm`; None
    where it could differ from the re-trace (`_written_storages`, and an in-place op whose functional
    variant gives its result another geometry; another dtype is cast back, `_cast_to_written`).

    Functionalization runs each in-place op's functional variant where the in-place op was, and
    every later reader of the written tensor (or of an alias of it) reads the new value; once the
    function returns, it copies each written input's final value into it, in input order. Here
    the other nodes are copied as they are, their arguments redirected to the written storage's
    latest value, and each new node's value is computed as the re-trace computes it, by running
    its op on the fake values of its arguments: with the geometry of every alias unchanged by the
    writes, the values downstream are those the re-trace computes. A view of another geometry made
    from a written value is recorded by the re-trace where it is first read: copied there too.
    """
    nodes = list(gm.graph.nodes)
    writes = {n: out_of_place(n.target) for n in nodes if _is_write(n)}
    if not all(writes.values()):
        return None
    found = _written_storages(nodes, writes) if writes else ({}, set())
    if found is None:
        return None
    groups, views_of_written = found
    storage_of = {alias: storage for storage, aliases in groups.items() for alias in aliases}
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    latest: dict[StorageWeakRef, torch.fx.Node] = {}  # written storage -> its value in the new graph

    def read(n: torch.fx.Node) -> torch.fx.Node:
        storage = storage_of.get(n)
        return latest[storage] if storage in latest else env[n]

    def copy_views_read_by(node: torch.fx.Node) -> None:
        for arg in node.all_input_nodes:
            if arg in views_of_written and arg not in env:
                copy_views_read_by(arg)
                env[arg] = graph.node_copy(arg, read)

    for node in nodes:
        if node in views_of_written:
            continue
        if node.op != "output":
            copy_views_read_by(node)
        if node in writes:
            args, kwargs = torch.fx.map_arg((_functional_args(node, writes[node]), node.kwargs), read)
            new = graph.call_function(writes[node], args, kwargs)
            new.meta["val"] = fake_run(writes[node], new)
            new = _cast_to_written(graph, new, node.args[0].meta["val"])
            if not _same_geometry(new.meta["val"], node.args[0].meta["val"]):
                return None  # later readers would see other strides than the traced ones
            env[node] = latest[storage_of[node]] = new
            continue
        if node.op == "output":
            for placeholder in gm.graph.find_nodes(op="placeholder"):
                if storage_of.get(placeholder) in latest:
                    graph.call_function(aten.copy_.default, (env[placeholder], latest[storage_of[placeholder]]))
            copy_views_read_by(node)
        env[node] = graph.node_copy(node, read)
    return graph


def _cast_to_written(graph: torch.fx.Graph, new: torch.fx.Node, written) -> torch.fx.Node:
    """The functional variant's result in the written tensor's dtype. The in-place op computes in the
    promoted dtype and stores into its tensor's own (`f32_scalar.div_(f64_scalar)`, as an optimizer's bias
    correction divides by a float64 learning rate); functionalization records that store as `_to_copy`."""
    value = new.meta["val"]
    if not isinstance(value, torch.Tensor) or not isinstance(written, torch.Tensor) or value.dtype == written.dtype:
        return new
    cast = graph.call_function(aten._to_copy.default, (new,), {"dtype": written.dtype, "layout": torch.strided})
    cast.meta["val"] = fake_run(aten._to_copy.default, cast)
    return cast


def _functional_args(node: torch.fx.Node, functional: torch._ops.OpOverload) -> tuple:
    """`node`'s positional arguments for its functional variant: those it leaves to the in-place op's
    defaults and the variant requires filled in (`bernoulli_(p=0.5)` is `bernoulli.p(self, 0.5)`)."""
    args = list(node.args)
    for written, wanted in zip(node.target._schema.arguments[len(args):], functional._schema.arguments[len(args):]):
        if wanted.kwarg_only or wanted.has_default_value() or written.name in node.kwargs:
            break
        args.append(written.default_value)
    return tuple(args)


def _is_write(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target._schema.is_mutable)


def _written_storages(nodes: list[torch.fx.Node], writes: dict) -> tuple[dict, set] | None:
    """(each storage an in-place op writes -> the nodes whose value it holds (its aliases of the written
    geometry, which read the storage's latest value); the views of another geometry made after a storage's
    last write), or None where the rewrite could differ from the re-trace: an
    alias of another geometry that the re-trace would replay on a new value (`_replayed`), writes of one
    storage through several geometries, a storage of several graph inputs or of a constant, a write with its
    arguments in several fake modes."""
    aliases = defaultdict(list)
    for n in nodes:
        storage = node_storage(n)
        if storage is not None:
            aliases[storage].append(n)
    written = defaultdict(list)
    for write in writes:
        storage = node_storage(write.args[0]) if write.args and isinstance(write.args[0], torch.fx.Node) else None
        if storage is None or node_storage(write) != storage or not _fake_mode(write):
            return None
        written[storage].append(write)
    position = {n: k for k, n in enumerate(nodes)}
    groups, views_of_written = {}, set()
    for storage, storage_writes in written.items():
        group, geometry = aliases[storage], storage_writes[0].args[0].meta["val"]
        if (sum(n.op == "placeholder" for n in group) > 1 or any(n.op == "get_attr" for n in group)
                or not all(_same_geometry(w.args[0].meta["val"], geometry) for w in storage_writes)):
            return None
        others = [n for n in group if not _same_geometry(n.meta["val"], geometry)]
        if any(_replayed(n, storage_writes, position) for n in others):
            return None
        groups[storage] = [n for n in group if n not in others]
        last = max(position[w] for w in storage_writes)
        views_of_written.update(n for n in others if position[n] > last)
    return groups, views_of_written


def _replayed(alias: torch.fx.Node, storage_writes: list, position: dict) -> bool:
    """Would the re-trace compute `alias` (a view of a written storage with a geometry of its own) again from a
    value written after it was made? Not where it is made after the storage's last write (the copy computes it
    from the latest value, as the re-trace does: a classifier's `view` of an activation written by `relu_`), or
    read only before the first write (it holds the value it was made from); then it is copied as any node."""
    first, last = (f(position[w] for w in storage_writes) for f in (min, max))
    if alias.op == "placeholder":
        return True
    return position[alias] < last and any(position[user] > first for user in alias.users)


def _same_geometry(a, b) -> bool:
    """Same sizes, strides, offset, dtype and device, and the same lazy negation and conjugation (a `_neg_view`
    has its base's geometry, and a write into it stores the value negated); symbolic sizes compared as
    expressions, so that the comparison adds no guard on the graph's sizes."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.device == b.device and a.is_neg() == b.is_neg() and a.is_conj() == b.is_conj()
            and _exprs(a) == _exprs(b))


def _exprs(t: torch.Tensor) -> tuple:
    sizes = (*t.shape, *t.stride(), t.storage_offset())
    return tuple(s.node.expr if isinstance(s, torch.SymInt) else s for s in sizes)


@functools.cache
def out_of_place(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """`aten.add.Tensor` for `aten.add_.Tensor` (`copy` for `copy_`, `bernoulli.p` for `bernoulli_.float`):
    the functional variant functionalization runs instead of an in-place op that writes its first argument
    and returns it, found as torchgen pairs them, by the signature (argument names and types); None for any
    other mutating op (out= ops, ops writing several arguments, ops without such a variant)."""
    schema = op._schema
    name = schema.name.split("::")[-1]
    arguments = schema.arguments
    written = [a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write]
    if not name.endswith("_") or written != [arguments[0].name] or len(schema.returns) != 1:
        return None
    packet = getattr(aten, name[:-1], None)
    wanted = _signature(schema)
    for overload in packet.overloads() if isinstance(packet, torch._ops.OpOverloadPacket) else ():
        functional = getattr(packet, overload)
        if (not functional._schema.is_mutable and not functional.is_view and len(functional._schema.returns) == 1
                and _signature(functional._schema) == wanted):
            return functional
    return None


def _signature(schema) -> tuple:
    return tuple((a.name, str(a.type), a.kwarg_only) for a in schema.arguments)



def _fake_mode(node: torch.fx.Node) -> FakeTensorMode | None:
    """The one fake mode of the values of `node`'s arguments (None if they have several: a graph
    traced on real tensors gives each value a mode of its own)."""
    modes = {v.fake_mode for v in pytree.tree_leaves(_arg_values(node)) if isinstance(v, FakeTensor)}
    return modes.pop() if len(modes) == 1 else None


def _arg_values(node: torch.fx.Node) -> tuple:
    return torch.fx.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])


def fake_run(op: torch._ops.OpOverload, node: torch.fx.Node):
    """`op` run on the fake values of `node`'s arguments, in their fake mode, as the re-trace runs it."""
    args, kwargs = _arg_values(node)
    with _fake_mode(node), torch.no_grad(), torch._C._DisableAutocast():
        return op(*args, **kwargs)


def _lift_input_mutations(graph: torch.fx.Graph) -> list[InputMutation]:
    """Turn the trailing `copy_(placeholder, value)` nodes into extra outputs."""
    placeholders = {n: i for i, n in enumerate(graph.find_nodes(op="placeholder"))}
    output = graph.find_nodes(op="output")[0]
    outs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    mutations = []
    _drop_input_restrides(graph, placeholders)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0] in placeholders:
            if node.users:
                raise KilnLimit("kiln: a graph that reads the result of copy_ into its input")
            mutations.append(InputMutation(placeholders[node.args[0]], len(outs)))
            outs.append(node.args[1])
            graph.erase_node(node)
    output.args = (outs,)
    return mutations


_RESTRIDES = (aten.as_strided_.default, aten.resize_.default)
"""What functionalization replays for an input whose geometry changed: `as_strided_`, or for a change of
size `resize_` (then `copy_` of the viewed value)."""


def _drop_input_restrides(graph: torch.fx.Graph, placeholders: dict) -> None:
    """Take out the `as_strided_(input, ...)` that functionalization replays for an input an in-place view
    op (`t_`, `unsqueeze_`) changed: the runtime gives the input its new geometry after the call
    (`OutputSignature.restrided_inputs`), and the `copy_` into the restrided input that follows becomes an
    ordinary input mutation, its value copied once the input has that geometry, unless it is a view of the
    input itself (a change of geometry alone: nothing to copy)."""
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _RESTRIDES and node.args[0] in placeholders:
            for copy in [u for u in node.users if u.target is aten.copy_.default and not u.users]:
                if _view_of(copy.args[1], node.args[0]):  # the input's own data: its geometry alone changed
                    graph.erase_node(copy)
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def _view_of(node, placeholder: torch.fx.Node) -> bool:
    """Is `node` a chain of view ops of `placeholder` (whose data the functional graph never changes)?"""
    while isinstance(node, torch.fx.Node) and node is not placeholder:
        if node.op != "call_function" or not getattr(node.target, "is_view", False):
            return False
        node = node.args[0]
    return node is placeholder


def _remove_identities(graph: torch.fx.Graph) -> None:
    """Drop ops that return their input's value unchanged: `detach`, `alias`, same-meta `copy`.

    Autograd's saved-variable unpacking leaves `detach` nodes in the joint graph and
    decompositions leave `copy(dst, src)` where `src` already has `dst`'s metadata;
    without autograd in the graph they only obscure what the partitioner sees.
    """
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.detach.default, aten.alias.default):
            node.replace_all_uses_with(node.args[0])
        elif node.target is aten.copy.default:
            dst, src = node.args[0].meta.get("val"), node.args[1].meta.get("val")
            if (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and dst.shape == src.shape
                    and dst.dtype == src.dtype and dst.device == src.device and dst.stride() == src.stride()):
                node.replace_all_uses_with(node.args[1])


def _own_storages(graph: torch.fx.Graph, count: int) -> None:
    """Give each of the first `count` outputs that is an input (or a constant of the graph), or another
    of them, or a view of either, a storage of its own.

    Eager returns each of these outputs as a new tensor, but in the functional graph a write can
    become the value it wrote: `t = a + 1; t[...] = a; return t` returns `a`'s value, and once
    `copy(t, a)` is dropped as an identity, the graph returns the input `a` itself (and
    `t.copy_(u); return u, t` returns one tensor twice). Without a copy the caller would get its
    own input back, or two outputs where writing one changes the other.
    """
    output = graph.find_nodes(op="output")[0]
    outs = list(output.args[0])
    claimed: set[torch.fx.Node] = set()  # the nodes whose storage an earlier output already holds
    for k in range(count):
        if not isinstance(outs[k], torch.fx.Node):
            continue
        chain = _view_chain(outs[k])
        if chain[0].op in ("placeholder", "get_attr") or chain[0] in claimed:
            with graph.inserting_before(output):
                outs[k] = _replay_on_copy(graph, chain)
            chain = _view_chain(outs[k])
        claimed.add(chain[0])
    output.args = (outs,)


def _view_chain(node: torch.fx.Node) -> list[torch.fx.Node]:
    """[root, ..., node]: the views (and items of `split`'s list) from the node whose storage `node` is on."""
    chain = [node]
    while node.op == "call_function":
        op = node.args[0].target if node.target is operator.getitem else node.target
        if not getattr(op, "is_view", False):
            break
        node = node.args[0]
        chain.append(node)
    return chain[::-1]


def _storage_chain(node: torch.fx.Node) -> list[torch.fx.Node]:
    """`_view_chain`, continued through in-place ops (whose result is the tensor they write: `x.mul_(2).expand(...)`
    views `x`) up to the tensor that owns the storage."""
    chain = _view_chain(node)
    while (root := _written_tensor(chain[0])) is not chain[0]:
        chain = _view_chain(root) + chain[1:]
    return chain


def _replay_on_copy(graph: torch.fx.Graph, chain: list[torch.fx.Node]) -> torch.fx.Node:
    """The views of `chain` taken again from a clone of its root: the same geometry (strides, not
    only values, as eager's output has them), on a storage of its own."""
    new = graph.call_function(aten.clone.default, (chain[0],))
    new.meta["val"] = fake_run(aten.clone.default, new)
    for old in chain[1:]:
        base = old.args[0]
        new = graph.node_copy(old, lambda n, base=base, copy=new: copy if n is base else n)
        new.meta["val"] = fake_run(new.target, new)
    return new


def verify_functional(gm: torch.fx.GraphModule) -> None:
    """Raise if any op of `gm` can mutate its arguments."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target._schema.is_mutable:
                raise NotImplementedError(
                    f"kiln: {node.target} still mutates its input after functionalization (node {node.name})")

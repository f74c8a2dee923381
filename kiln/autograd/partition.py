"""Splitting the functional joint graph into a forward and a backward graph.

Every tensor the backward reads that the forward computed must be either saved
by the forward (memory, held from forward to backward) or recomputed by the
backward from tensors that are saved. Which ones to save is a minimum cut:

    source -> primal_in                   inf   (inputs are available in the forward)
    source -> v_in                        inf   for v the forward must compute and
                                                that may not be recomputed
    v_in   -> v_out                       bytes(v)   (cutting it = saving v)
    v_out  -> u_in                        inf   for each use of v by a forward-side node u
    v_out  -> sink                        inf   when the backward reads v

Forward-side nodes are the ones that do not depend on a tangent. Only ops that
are cheap and deterministic may be recomputed (`RECOMPUTABLE`: pointwise ops,
views, a few constructors); matmuls, convolutions, reductions, random ops and
anything unknown are computed once, in the forward. Nor is a value recomputed
whose reads in the backward lie apart, on either side of a matmul or convolution
(`_chained`): the backward consumes a residual stream x1 = x0 + a0, x2 = x1 + b1, ...
from its end, so recomputing it from x0 and the branch outputs would compute every
link before the backward's first step and hold them all, as much memory as saving
them, plus the work (one wide kernel with an output per link in a transformer's
backward). Values read close together are recomputed together: a LayerNorm's or
RMSNorm's normalized input x * rstd from the input and the per-row statistics the
forward saves, inside the norm's backward kernel, as Inductor's partitioner does.
A cut separates source and
sink; its capacity is the bytes saved (inputs that require grad, the parameters,
count nothing: they are held anyway), weighed as below. The "naive" partition
(save every forward tensor the backward reads) is one such cut, so the minimum
never costs more. Of all minimum cuts the one closest to the sink is taken: equal
cost, least recomputation.

What the code generator stores anyway weighs in too. A compiler that fuses ops
(`fused`: the ops it generates kernels for) never writes a pointwise value whose
readers it all fuses in one epoch, unless it is saved: saving it costs a store,
while saving its input that an extern (a convolution) wrote costs nothing. Such
values cost a quarter more per byte (`cut_cost`), so the CNN's conv -> relu ->
max-pool saves the convolution's output and the pool reads relu(conv) in its own
kernel, with no relu kernel in the forward. And a value a matmul or convolution of
the backward reads is saved, not recomputed (`_written_in_backward`): recomputed,
it would be written there anyway.

Identical pure forward ops (autocast casts the same input once per linear that
reads it) are merged first (`merge_duplicates`), so their value is saved once.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.autograd.maxflow import FlowGraph
from kiln.autograd.storages import node_storage
from kiln.effects import eliminate_dead_code, has_effect
from kiln.runtime.lazy_graphs import graph_module

aten = torch.ops.aten

RECOMPUTABLE_OPS = {
    operator.getitem,
    aten._unsafe_view.default, aten.clone.default, aten._to_copy.default, aten.cat.default,
    aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
    aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
}
"""Ops besides pointwise and view ops that are cheap to recompute in the backward."""


STORED_COST, UNSTORED_COST = 4, 5
"""Per byte saved, what the cut counts (`_JointNodes.cut_cost`): a value the forward writes anyway, and one it
writes only to save it."""


EXPOSED_COST = 2 ** 62
"""What saving an exposed primal (`JointLayout.exposed_primals`) adds to its bytes: more than any set of values the
backward could save instead, so the cut saves the values computed from it, as eager does, and the primal only
where no cut avoids it. A primal saved to recompute from, which the caller writes in place before the backward,
would fail autograd's version check where eager's backward runs. An output the caller holds, which eager's backward
does not read, is exposed the same way (`JointLayout.exposed_outputs`): `y.mul_(2)` before the backward."""


DTYPE_CASTS = {aten._to_copy.default, torch.ops.prims.convert_element_type.default}
"""A value's copy in another dtype: eager's kernels cast inside the op (a bf16 product computed in float32) and save
the value itself; recomputed from it in the backward, as eager's backward reads what it saved."""


def is_recomputable(node: fx.Node) -> bool:
    """May `node` be computed a second time, in the backward, with the same result at little cost?"""
    if node.op != "call_function":
        return False
    target = node.target
    if target in RECOMPUTABLE_OPS:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        # a float computed from sizes (`n / 2` as an add's alpha): Python arithmetic, recomputed in the backward
        # from the sizes it reads (saved free), as no tensor can hold it
        return isinstance(node.meta.get("val"), torch.SymFloat)
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return target.is_view or torch.Tag.pointwise in target.tags


def node_bytes(node: fx.Node) -> float:
    """Memory held by saving `node`'s value: its storage (a view keeps its base alive).

    A size (a SymInt of a dynamic-shape graph) is saved as a Python int: free. Symbolic
    byte counts are taken at the sizes of the call being compiled (their hint), so the
    cut is the best one for that call and a valid one for every other.
    """
    val = node.meta.get("val")
    if is_size(node):
        return 0
    if not isinstance(val, torch.Tensor):
        return math.inf
    try:
        return _hint(val.untyped_storage().nbytes())
    except (NotImplementedError, RuntimeError):
        return _hint(val.numel() * val.element_size())


def is_size(node: fx.Node) -> bool:
    """Does `node` compute an integer (a symbolic size, `sym_size`, arithmetic on sizes)?"""
    val = node.meta.get("val")
    return isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool)



def _hint(n) -> int:
    return n.node.hint if isinstance(n, torch.SymInt) else n


@dataclass
class Partition:
    """A forward graph, a backward graph, and the decision that split them."""

    forward: fx.GraphModule
    backward: fx.GraphModule
    strategy: str
    saved: list[str]
    """Names of the forward's values the backward receives: tensors, and sizes (see `saved_is_size`)."""
    saved_is_size: list[bool]
    saved_bytes: int
    naive_saved: list[str]
    naive_bytes: int
    saved_inputs: list[int | None]
    """Per saved tensor: the primal whose storage it shares (the input itself or a view), or None."""
    saved_input_bytes: int
    """Of `saved_bytes`, those held by inputs (parameters, ...) that stay alive anyway."""
    recomputed: list[str] = field(default_factory=list)
    saved_outputs: list[int | None] = field(default_factory=list)
    """Per saved tensor: the joint output whose storage it shares (the output itself or a view), or None."""

    def summary(self) -> str:
        ratio = f"{self.saved_bytes / self.naive_bytes:.2f}" if self.naive_bytes else "-"
        return (f"{self.strategy}: save {len(self.saved)} tensors, {self.saved_bytes} bytes, "
                f"{self.saved_input_bytes} of them inputs' "
                f"(naive save-all: {len(self.naive_saved)} tensors, {self.naive_bytes} bytes; ratio {ratio}); "
                f"run {len(self.recomputed)} forward ops in the backward\n"
                f"  saved: {', '.join(self.saved)}\n"
                f"  recomputed: {', '.join(self.recomputed)}")


@dataclass
class JointLayout:
    """Which placeholders of the joint graph are primals and which outputs belong to which graph."""

    num_primals: int
    forward_outputs: list[int]
    backward_outputs: list[int]
    grad_primals: tuple[bool, ...] = ()
    """Per primal, whether it requires grad (a parameter: held by its module, so free to save)."""
    exposed_primals: tuple[bool, ...] = ()
    """Per primal, whether the caller may write it in place before the backward where eager's backward reads
    none of it (aot.py `_exposed_primals`): saved only where the backward reads it itself (`EXPOSED_COST`)."""
    exposed_outputs: tuple[int, ...] = ()
    """Joint outputs the caller receives (or a view of them) and may write in place before the backward, whose
    storage eager's backward does not read: saved, or a view of them, only where no cut avoids it, as exposed
    primals (`EXPOSED_COST`). Saved to recompute from (`y, y.exp() * y.sigmoid()`, where eager saves the exp and
    the sigmoid), a write to `y` fails the version check where eager's backward runs, or (through `.data`) changes
    the gradient."""
    outputs_saved_by_eager: tuple[int, ...] = ()
    """Joint outputs the caller receives whose storage eager's backward reads (`exp(x)` saves its result): the
    backward reads them as returned, never a recomputation, so that what the caller writes into them unseen by
    version counters (`y.data.mul_(2)`) reaches kiln's backward as it reaches eager's."""


def partition(joint: fx.GraphModule, layout: JointLayout, strategy: str = "min_cut",
              fused: Callable[[Any], bool] | None = None) -> Partition:
    """Split `joint` into forward and backward graphs (`strategy`: "min_cut" or "naive").

    `fused(target)`: whether the compiler fuses that op into kernels with its neighbours, so that a
    value only fused ops read is stored only when saved (None: every value is stored, as op by op)."""
    merge_duplicates(joint)
    nodes = _JointNodes(joint, layout)
    naive = nodes.naive_saved()
    saved = naive if strategy == "naive" else nodes.min_cut_saved(fused)
    cost = nodes.cut_cost(fused)
    if sum(map(cost, saved)) > sum(map(cost, naive)):
        raise AssertionError("kiln: min-cut partition costs more than save-all; this is a partitioner bug")
    backward = _extract(joint, saved + nodes.tangents, nodes.backward_outputs,
                        anchors=set(joint.graph.nodes) - nodes.forward_side_set, effects=nodes.backward_effects)
    unbound = _unbound_symbols(backward)
    if unbound:  # sizes the backward's kernels need that none of its inputs' shapes carries
        saved += [_size_node(joint, nodes.primals, symbol) for symbol in sorted(unbound, key=str)]
        backward = _extract(joint, saved + nodes.tangents, nodes.backward_outputs,
                            anchors=set(joint.graph.nodes) - nodes.forward_side_set, effects=nodes.backward_effects)
    forward = _extract(joint, nodes.primals, nodes.forward_outputs + saved, effects=nodes.forward_effects)
    recomputed = [n.name for n in backward.graph.nodes
                  if n.op == "call_function" and n.name in nodes.forward_side_names]
    input_storages = {StorageWeakRef(p.meta["val"].untyped_storage()): i for i, p in enumerate(nodes.primals)
                      if isinstance(p.meta["val"], torch.Tensor)}  # not an int input (a SymInt primal)
    saved_inputs = [None if is_size(n) else input_storages.get(StorageWeakRef(n.meta["val"].untyped_storage()))
                    for n in saved]
    saved_input_bytes = sum(node_bytes(n) for n, i in zip(saved, saved_inputs) if i is not None)
    output_storages: dict = {}
    for j in layout.forward_outputs:
        output_storages.setdefault(node_storage(joint_outputs(joint)[j]), j)
    output_storages.pop(None, None)
    saved_outputs = [None if is_size(n) else output_storages.get(node_storage(n)) for n in saved]
    return Partition(forward, backward, strategy, [n.name for n in saved], [is_size(n) for n in saved],
                     int(sum(map(node_bytes, saved))), [n.name for n in naive], int(sum(map(node_bytes, naive))),
                     saved_inputs, int(saved_input_bytes), recomputed, saved_outputs)


def joint_outputs(joint: fx.GraphModule) -> list:
    return joint.graph.find_nodes(op="output")[0].args[0]


def merge_duplicates(joint: fx.GraphModule) -> None:
    """Replace each pointwise op of `joint` that repeats an earlier one (same op, same arguments) by it.

    Autocast casts an input to bf16 once per linear that reads it (a gated MLP's gate and up projections):
    two equal values, which the backward's matmuls both read and the partition would save twice. Views
    and returned values are not replaced: an output, or the base an output views, is memory of its own to the
    caller (two outputs computed alike, `(t.half() + 1).view(torch.int16)` twice, share no storage in eager)."""
    outputs = _returned_storage(joint_outputs(joint))
    seen: dict[tuple, fx.Node] = {}
    for node in list(joint.graph.nodes):
        if node.op != "call_function" or _is_view(node) or not is_recomputable(node) \
                or node.target is operator.getitem:
            continue
        try:
            first = seen.setdefault((node.target, _hashable(node.args), _hashable(node.kwargs)), node)
        except TypeError:  # an argument that cannot be a key (a symbolic float): the op is kept as it is
            continue
        if first is not node and node not in outputs:
            node.replace_all_uses_with(first)
            joint.graph.erase_node(node)


def _returned_storage(outs) -> set[fx.Node]:
    """The nodes whose memory the graph returns: each output and, through views, the base it views."""
    returned, stack = set(), [o for o in outs if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in returned:
            returned.add(node)
            if _is_view(node) and node.args and isinstance(node.args[0], fx.Node):
                stack.append(node.args[0])
    return returned


def _hashable(value):
    """`value` (node arguments) with lists and dicts made tuples, so that equal arguments give equal keys."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _sizes_of_floats(node: fx.Node) -> list[fx.Node]:
    """`node`, or where it is a float computed from sizes (a SymFloat), the nodes it is computed from, down to
    the sizes."""
    if not isinstance(node.meta.get("val"), torch.SymFloat):
        return [node]
    return [s for n in node.all_input_nodes for s in _sizes_of_floats(n)]


def _unbound_symbols(gm: fx.GraphModule) -> set:
    """Symbols in `gm`'s sizes that no placeholder carries as a whole size, stride or int."""
    used, bound = set(), set()
    for node in gm.graph.nodes:
        exprs = _size_exprs(node.meta.get("val"))
        used.update(s for e in exprs for s in e.free_symbols)
        if node.op == "placeholder":
            bound.update(e for e in exprs if e.is_Symbol)
    return used - bound


def _size_exprs(val) -> list:
    if isinstance(val, torch.SymInt):
        return [val.node.expr]
    if isinstance(val, torch.Tensor):
        return [s.node.expr for s in (*val.shape, *val.stride()) if isinstance(s, torch.SymInt)]
    return []


def _size_node(joint: fx.GraphModule, primals: list[fx.Node], symbol) -> fx.Node:
    """A `sym_size` node of the joint graph reading `symbol` off the primal whose size it is, or the primal
    that is `symbol` (an int input)."""
    for primal in primals:
        val = primal.meta["val"]
        if isinstance(val, torch.SymInt) and val.node.expr == symbol:
            return primal
        for dim, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                with joint.graph.inserting_after(list(joint.graph.find_nodes(op="placeholder"))[-1]):
                    node = joint.graph.call_function(aten.sym_size.int, (primal, dim))
                node.meta["val"] = size
                return node
    raise AssertionError(f"kiln: size {symbol} of the backward is no input's size")


class _JointNodes:
    """The joint graph's nodes classified: forward side, required by the forward, read by the backward."""

    def __init__(self, joint: fx.GraphModule, layout: JointLayout):
        placeholders = list(joint.graph.find_nodes(op="placeholder"))
        self.primals = placeholders[:layout.num_primals]
        self.held = {p for p, grad in zip(self.primals, layout.grad_primals) if grad}
        self.tangents = placeholders[layout.num_primals:]
        outs = joint.graph.find_nodes(op="output")[0].args[0]
        self.forward_outputs = [outs[i] for i in layout.forward_outputs]
        self.backward_outputs = [outs[i] for i in layout.backward_outputs]
        tangent_dependent = set(self.tangents)
        for node in joint.graph.nodes:
            if node.op != "output" and any(a in tangent_dependent for a in node.all_input_nodes):
                tangent_dependent.add(node)
        self.forward_side = [n for n in joint.graph.nodes
                             if n.op in ("placeholder", "get_attr", "call_function") and n not in tangent_dependent]
        self.backward_nodes = [n for n in joint.graph.nodes if n in tangent_dependent]
        self.forward_side_set = set(self.forward_side)
        self.forward_side_names = {n.name for n in self.forward_side}
        self.exposed = self._on_exposed_storage(layout, outs)
        self.read_as_returned = self._on_storages({node_storage(outs[i]) for i in layout.outputs_saved_by_eager})
        # ops that must run though no output reads them (an `assert` on a tensor's value, an unused random
        # draw, which moves the generator): each runs once, on its side, where eager runs it
        self.forward_effects = [n for n in self.forward_side if n.op == "call_function" and has_effect(n)]
        self.backward_effects = [n for n in self.backward_nodes if n.op == "call_function" and has_effect(n)]
        required = ancestors(self.forward_outputs + self.forward_effects)
        for node in list(required):  # every value of a multi-output op the forward runs is available
            required.update(u for u in node.users if u.target is operator.getitem)
        self.required_forward = required | {n for n in self.forward_side if n.op != "call_function"}
        self.backward_reads = {n for n in self.forward_side
                               if any(u in tangent_dependent for u in n.users)} | {
                              n for n in self.backward_outputs if n is not None and n not in tangent_dependent}
        self.computed_from_returned = self._computed_for_backward_from(self.read_as_returned)

    def _on_exposed_storage(self, layout: JointLayout, outs: list) -> set[fx.Node]:
        """The forward values on the storage of an exposed primal or output (`JointLayout`): the primal or output
        and its views (`x.t()`), which share its version counter. An output on a primal's storage is the
        primal's (`exposed_primals` decides for it), and one on the storage of an output eager saves is that
        output's (`outputs_saved_by_eager`)."""
        primal_storages = {node_storage(p) for p in self.primals}
        storages = {node_storage(p) for p, exposed in zip(self.primals, layout.exposed_primals) if exposed}
        storages |= {node_storage(outs[i]) for i in layout.exposed_outputs} - primal_storages - {
            node_storage(outs[i]) for i in layout.outputs_saved_by_eager}
        return self._on_storages(storages)

    def _on_storages(self, storages: set) -> set[fx.Node]:
        storages.discard(None)
        return {n for n in self.forward_side if storages and node_storage(n) in storages}

    def _computed_for_backward_from(self, values: set[fx.Node]) -> set[fx.Node]:
        """The forward values computed, directly or not, from `values` that the forward itself does not need: work
        of the backward that tracing put before it (`cos(y)` for the gradient of `y.sin()`). Not the views on their
        storage, which read them as they are."""
        computed: set[fx.Node] = set()
        for node in self.forward_side:
            if node not in self.required_forward and node not in values and any(
                    a in values or a in computed for a in node.all_input_nodes):
                computed.add(node)
        return computed

    def save_cost(self, node: fx.Node) -> float:
        """What saving `node` costs the cut: its bytes, except for a primal that requires grad (a parameter),
        which its owner holds anyway. So a value recomputed from an extern's output and parameters (a
        convolution's bias added, then ReLU) is not saved in the extern's stead for the parameters' bytes. An
        exposed primal or output, or a view of one, costs `EXPOSED_COST` more; so does a value computed for the
        backward from an output eager saves (`cos(y)`, `y <= 0`): eager computes it in the backward from the output
        as the caller left it, and so does kiln's, where a cut allows."""
        if node in self.exposed or node in self.computed_from_returned:
            return node_bytes(node) + EXPOSED_COST
        return 0 if node in self.held else node_bytes(node)

    def naive_saved(self) -> list[fx.Node]:
        """Every forward tensor that a node outside the forward reads (for a float computed from sizes, which
        no tensor holds, the sizes it reads: the backward recomputes it)."""
        fwd = self.required_forward
        read = [n for n in self.forward_side if n in fwd and (
            n in self.backward_reads or any(u not in fwd and u.op != "output" for u in n.users))]
        return list(dict.fromkeys(s for n in read for s in _sizes_of_floats(n)))

    def cut_cost(self, fused: Callable[[Any], bool] | None) -> Callable[[fx.Node], float]:
        """What saving a node costs the cut, in quarter bytes: its `save_cost`, and a quarter more for a value
        a fusing compiler writes only if it is saved (`_unstored`), for the forward's write that saving adds.
        So a norm saves its stored input and per-row statistics (1/D of it) rather than the normalized input
        it would write for the backward, but never half again the bytes to spare a write."""
        unstored = self._unstored(fused)
        return lambda node: self.save_cost(node) * (UNSTORED_COST if node in unstored else STORED_COST)

    def min_cut_saved(self, fused: Callable[[Any], bool] | None = None) -> list[fx.Node]:
        """The saved set of the minimum cut closest to the sink (see the module docstring)."""
        flow = FlowGraph()
        banned = self._written_in_backward(fused) | self._returned_and_saved_by_eager() | self._compared_in_backward()
        banned |= self._chained(fused, banned)
        # a float computed from sizes cannot be saved (no tensor holds it): banned from recomputation, the backward
        # could have it neither way, and no cut would separate the source from the sink. Recomputed from the sizes
        # it reads, it costs nothing held across the backward.
        banned = {n for n in banned if not isinstance(n.meta.get("val"), torch.SymFloat)}
        cost = self.cut_cost(fused)
        for node in self.forward_side:
            if node.op != "call_function" or (node in self.required_forward and not is_recomputable(node)) \
                    or node in banned:
                flow.add_edge("source", (node, "in"), math.inf)
            flow.add_edge((node, "in"), (node, "out"), cost(node))
            for user in node.users:
                if user in self.forward_side_set:
                    flow.add_edge((node, "out"), (user, "in"), math.inf)
            if node in self.backward_reads:
                flow.add_edge((node, "out"), "sink", math.inf)
        flow.node("sink")
        flow.max_flow("source", "sink")
        sink_side = flow.sink_side("sink")
        return [n for n in self.forward_side if (n, "in") not in sink_side and (n, "out") in sink_side]

    def _unstored(self, fused: Callable[[Any], bool] | None) -> set[fx.Node]:
        """Forward values a fusing compiler (`fused`: the ops it generates kernels for) never writes to memory
        unless they are saved: pointwise values that are no output and whose readers, in the forward and
        the backward, it all fuses, each forward reader in the value's own epoch (`_epochs`). A value read
        on both sides of a matmul (a residual stream, read by a norm and by the next residual add) is
        written for the later reader anyway. None without `fused` (op by op, every value is written)."""
        if fused is None:
            return set()
        epochs = self._epochs(self.forward_side, fused)
        outputs = set(self.forward_outputs)
        return {n for n in self.forward_side if n not in outputs and _only_fused_read(n, fused) and all(
            epochs.get(u, epochs[n]) == epochs[n] for u in _readers(n) if u in self.forward_side_set)}

    def _returned_and_saved_by_eager(self) -> set[fx.Node]:
        """Forward values that may not be recomputed because they are (views of) an output the caller receives
        whose storage eager's backward reads (`JointLayout.outputs_saved_by_eager`), or forward values computed
        from one: the backward reads the output as returned, with whatever the caller wrote into it, as eager's
        does, and the values the forward computed from it as the forward computed them (eager saved `exp(t)`
        for `exp(t) * t`, not a recomputation from `t` as written since). Not a cast (`DTYPE_CASTS`), and not a
        view: a view recomputed from the saved output reads the storage the caller wrote, as eager's does, and
        saving views of one output apart from it costs their bytes again (a Cholesky factor and its transposes)."""
        returned = {n for n in self.read_as_returned if n.op == "call_function" and not _is_view(n)}
        return returned | {n for n in self.required_forward if n.op == "call_function" and n not in returned
                           and n.target not in DTYPE_CASTS
                           and any(a in self.read_as_returned for a in n.all_input_nodes)}

    def _compared_in_backward(self) -> set[fx.Node]:
        """Forward values that an equality only the backward needs reads (`eq`, `ne`: which elements a max or min
        picked, `x == amax(x)`, wherever the cut puts it): recomputed in the backward they need not have the bits
        the forward's kernel gave them (a vectorized and a scalar `log` differ by an ulp), so no element equalled
        the saved max and the gradient divided by a count of 0 (fuzz 96677). Kept from recomputation, the
        comparison reads the forward's bits (the cut saves them, or the mask the forward computes), as eager's."""
        return {n for n in self.forward_side if n in self.required_forward and is_recomputable(n) and not _is_view(n)
                and any(u not in self.required_forward and getattr(u.target, "overloadpacket", None) in EQUALITIES
                        for u in _readers(n))}

    def _written_in_backward(self, fused: Callable[[Any], bool] | None) -> set[fx.Node]:
        """Forward values that may not be recomputed because a matmul or convolution of the backward reads them
        (through views): recomputed, such a value would be written to memory in the backward for that op,
        a kernel, its inputs' reads and its own write, to save its bytes (a weight's bf16 copy under autocast,
        which the recompute makes from the fp32 weight, twice its bytes). Inductor's partitioner bans the same
        ("materialized in backward"). Only for a fusing compiler (`fused`): op by op, every value recomputed
        is written, and the cut saves what is least memory."""
        banned: set[fx.Node] = set()
        if fused is None:
            return banned
        for node in self.forward_side:
            if node in self.required_forward and is_recomputable(node) and not _is_view(node) and any(
                    u not in self.forward_side_set and _separates_kernels(u, fused) for u in _readers(node)):
                banned.add(node)
        return banned

    def _chained(self, fused: Callable[[Any], bool] | None = None, banned: set = frozenset()) -> set[fx.Node]:
        """Forward values that may not be recomputed because recomputing them would hold a value across
        the backward (see the module docstring).

        The backward runs in epochs: the ops between two matmuls or convolutions (`_separates_kernels`), whose
        reads of a value come close together. A value recomputed in the backward is computed at its first
        read and held until its last, so a value whose reads span epochs is held across them, as if
        saved: the residual stream's link x1 = x0 + a0 is read by its norm's backward and, recomputed,
        by the recomputation of x2 = x1 + b1, one block earlier in the backward. Walking the forward
        from its end, a value's reads are the backward's direct reads and the reads of each value it
        recomputes that is not banned; a value whose reads span epochs is banned (computed in the
        forward and saved), so the values it is computed from are not read for it. Views are never
        banned (their base is). A normalization's statistic (rsqrt of a saved variance) and its input,
        read by the same norm's backward, are read in one epoch: x * rsqrt is recomputed there from them."""
        feeds = self._feeds_backward()
        epochs = self._backward_epochs(fused)
        last_epoch = max(epochs.values(), default=0)
        banned = set(banned)  # already: computed in the forward, so nothing is read to recompute them
        reads: dict[fx.Node, tuple[int, int]] = {}  # per recomputed value: first and last epoch reading it
        for node in reversed(self.forward_side):
            if node not in feeds:
                continue
            spans = [(e, e) for e in (epochs.get(u, last_epoch) for u in node.users if u not in self.forward_side_set
                                      and u.op != "output")]
            spans += [reads[u] for u in node.users if u in reads and u not in banned]
            if not spans:
                continue
            first, last = min(s[0] for s in spans), max(s[1] for s in spans)
            if last > first and node in self.required_forward and not _is_view(node):
                banned.add(node)
            reads[node] = (first, last)
        return banned

    def _backward_epochs(self, fused: Callable[[Any], bool] | None) -> dict[fx.Node, int]:
        return self._epochs(self.backward_nodes, fused)

    @staticmethod
    def _epochs(nodes: list[fx.Node], fused: Callable[[Any], bool] | None) -> dict[fx.Node, int]:
        """Per node of `nodes` (in order), how many kernel-separating ops (matmuls, convolutions) of `nodes`
        precede it on its longest path: the ops of one epoch read their inputs close together in time, and
        may share a kernel."""
        epochs: dict[fx.Node, int] = {}
        for node in nodes:
            epochs[node] = max((epochs[a] + _separates_kernels(a, fused) for a in node.all_input_nodes
                                if a in epochs), default=0)
        return epochs

    def _feeds_backward(self) -> set[fx.Node]:
        """Recomputable forward values from which the backward's reads may be recomputed: those it reads
        and, transitively, the recomputable inputs of those."""
        feeds: set[fx.Node] = set()
        for node in reversed(self.forward_side):
            if node.op == "call_function" and is_recomputable(node) and (
                    node in self.backward_reads or any(u in feeds for u in node.users)):
                feeds.add(node)
        return feeds


def _only_fused_read(node: fx.Node, fused: Callable[[Any], bool]) -> bool:
    """Is `node` a pointwise value that, unless saved, no op stores: it and every reader (through views,
    in the forward and the backward) are fused ops."""
    if not (is_recomputable(node) and fused(node.target)) or _is_view(node):
        return False
    return all(u.op == "call_function" and fused(u.target) for u in _readers(node))


EQUALITIES = frozenset((torch.ops.aten.eq, torch.ops.aten.ne))


def _readers(node: fx.Node) -> list[fx.Node]:
    """The nodes that read `node`'s value: its users, and through a view the view's readers."""
    readers, stack = [], list(node.users)
    while stack:
        user = stack.pop()
        if user.op == "call_function" and _is_view(user):
            stack.extend(user.users)
        else:
            readers.append(user)
    return readers


def _separates_kernels(node: fx.Node, fused: Callable[[Any], bool] | None) -> bool:
    """Does `node` end a run of fusible ops: a matmul, a convolution or another op that is neither pointwise,
    a view nor a reduction (with `fused`: one the compiler does not fuse either)?"""
    if node.op != "call_function" or is_recomputable(node):
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and torch.Tag.reduction in target.tags:
        return False
    return fused is None or not fused(target)


def _is_view(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def ancestors(roots: list) -> set:
    """The nodes among `roots` and every node they read, directly or not."""
    seen, stack = set(), [r for r in roots if isinstance(r, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _extract(joint: fx.GraphModule, inputs: list[fx.Node], outputs: list,
             anchors: set | None = None, effects: list = ()) -> fx.GraphModule:
    """The subgraph of `joint` computing `outputs` from `inputs` (which become its placeholders), and running
    `effects` (ops kept for their error or their effect: a check, a random draw no output reads).

    Nodes keep the joint graph's order, except that with `anchors` (the backward's own
    nodes) only anchors do: every other node (a forward op recomputed in the backward) is
    placed just before its first use, so that it is not held from the start of the backward.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        ph = graph.placeholder(node.name)
        ph.meta = dict(node.meta)
        env[node] = ph
    needed, stack = set(), [o for o in [*outputs, *effects] if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node in env or node in needed:
            continue
        if node.op == "placeholder":
            raise AssertionError(f"kiln: partition needs {node.name} but it is neither saved nor an input")
        needed.add(node)
        stack.extend(node.all_input_nodes)
    in_order = [n for n in joint.graph.nodes if n in needed]
    if anchors is not None:
        in_order = _on_demand_order([n for n in in_order if n in anchors] + [o for o in outputs if o in needed], env)
    for node in in_order:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    eliminate_dead_code(graph)
    return graph_module(joint, graph)


def _on_demand_order(anchors: list[fx.Node], available: dict) -> list[fx.Node]:
    """A topological order visiting `anchors` in turn, each preceded by its not yet placed inputs."""
    order, placed = [], set(available)
    for anchor in anchors:
        stack = [(anchor, False)]
        while stack:
            node, inputs_placed = stack.pop()
            if node in placed:
                continue
            if inputs_placed:
                placed.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((a, False) for a in reversed(node.all_input_nodes) if a not in placed)
    return order

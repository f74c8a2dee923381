"""A graph compiled as one autograd node per independent part: where it ends at the user's `backward()`, or where
its parts' outputs are computed from different inputs that require grad.

A compiled graph is one backward node for all its outputs (an autograd.Function); eager has a node per op.
Where the user's code calls `loss.backward()` right after the graph (the capture broke there), that backward
frees the node's saved tensors, and a later backward through another output of the graph raised "backward
through the graph a second time", where eager's own nodes for that output still held theirs (torch.compile
raises too). When the graph's outputs fall into parts that share no computation (the loss of a model, and an
activation computed from the inputs beside it), each part becomes a graph and a backward node of its own, and
the later backward goes through a node the first did not free, as in eager.

The split keeps eager's order where it matters: a part may write into a tensor (a module's running statistics,
a counter buffer) that another part reads only where that part runs first and is done before the write, and at
most one part may draw random numbers; a graph whose parts meet otherwise through a written tensor, or both
draw, stays whole. Parts compute what they read from the inputs each on their own, so a tensor (or a view of one)
that one part writes in place and another computes too keeps the graph whole: the other would read it from
before the write. What each node writes and draws is read from a fake run
of the graph (the ATen ops it runs: nothing is computed). Grad-mode and autocast switches (calls that take no
values and return none) are copied into every part, in their order, so each op runs in the mode it ran in.

Any graph is split where the parts giving outputs that require grad read different inputs that require grad: one
node for them all has an edge to each such input, and the autograd engine runs the history of every input a node
has an edge to, with a None gradient where nothing flows. A backward through `a.sin()` of `(a.sin(), a * b)`
then ran (and freed) the history of `b`, and raised where that history held a saved tensor written since, where
eager's backward never reaches it.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kiln.autograd.aliased_inputs import in_place_call, writes_an_input
from kiln.effects import written_arguments

_SEEDED = torch.Tag.nondeterministic_seeded


@dataclass
class Part:
    """One independent part: its graph, which of the whole graph's inputs it takes, which outputs it gives, and the
    values that do not require grad it takes from earlier parts and gives later ones (`handed_in`, `handed_out`:
    nodes of the whole graph), after its inputs and outputs."""

    gm: torch.fx.GraphModule
    inputs: list[int]
    outputs: list[int]
    handed_in: list[torch.fx.Node]
    handed_out: list[torch.fx.Node]


@dataclass
class Split:
    """The parts, in `gm`'s order, and the outputs no part computes: an input returned as it is (output
    position -> input position) or a constant (output position -> value)."""

    parts: list[Part]
    returned_inputs: dict[int, int]
    constants: dict[int, object]
    num_outputs: int


def independent_parts(gm: torch.fx.GraphModule, example_inputs: list, where_edges_differ: bool = False) -> Split | None:
    """`gm`'s parts when at least two of them give outputs that require grad and they do not meet through a
    written tensor or random draws; None otherwise (compile it whole). `where_edges_differ`: only where the
    parts' differentiable outputs are computed from different inputs that require grad (`_edges_differ`), and
    every computation of the graph is in a part.

    Parts that share computation only through values that do not require grad (an activation's bits seen as
    int16, a mask, indices) are split too where nothing else splits the graph: the part computing such a value
    hands it to the parts reading it, as eager's nodes meet no more than there (fuzz seed 470642)."""
    nodes = list(gm.graph.nodes)
    returned = nodes[-1].args[0]
    if not isinstance(returned, (tuple, list)):
        return None
    switches = {n for n in nodes if n.op == "call_function" and not n.all_input_nodes and not n.users}
    effects = functools.cache(lambda: _effects(gm, example_inputs))  # one fake run for both attempts
    return (_split(gm, example_inputs, where_edges_differ, nodes, switches, effects, lambda arg, n: False)
            or _split(gm, example_inputs, where_edges_differ, nodes, switches, effects,
                      lambda arg, n: _hands_off(arg, n, switches)))


def _hands_off(arg, node, switches: set) -> bool:
    """Whether `node` may read `arg` from another part: a tensor that does not require grad, which `node` does not
    write (a part never writes what another computed)."""
    value = arg.meta.get("example_value")
    return (_in(arg, switches) and isinstance(value, torch.Tensor) and not value.requires_grad
            and not in_place_call(node))


def _split(gm, example_inputs: list, where_edges_differ: bool, nodes: list, switches: set, effects_of: Callable,
           handed: Callable) -> Split | None:
    """`independent_parts`, with the edges `handed(arg, node)` says a part may cross (a value handed over);
    `effects_of()`: the graph's `_effects`."""
    returned = nodes[-1].args[0]
    switches = set(switches)  # a drawing switch leaves them below
    part_of = _union_parts(nodes, switches, handed)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    roots, returned_inputs, constants = {}, {}, {}
    for k, value in enumerate(returned):
        if not isinstance(value, torch.fx.Node):
            constants[k] = value
        elif value.op == "placeholder":
            returned_inputs[k] = placeholders.index(value)
        elif value.op == "get_attr":
            return None
        else:
            roots.setdefault(part_of(value), []).append(k)
    differentiable = [r for r, outs in roots.items() if any(_requires_grad(returned[k]) for k in outs)]
    # an input that requires grad written in place gets its new history from the graph's node: one more output
    may_write = any(map(in_place_call, nodes))
    if len(differentiable) < 2 and not (may_write and writes_an_input(gm)):
        return None  # with writes of inputs, the written inputs may be parts of their own even where no output is
    if where_edges_differ and not may_write and not _edges_differ(
            {r: _reaching([returned[k] for k in roots[r]], handed) for r in roots}, roots, returned, placeholders,
            example_inputs):
        return None  # before the fake run below: most graphs stop here
    effects = effects_of()
    if effects is None:
        return None
    if may_write:
        # a write giving an input that requires grad a new history that no later op reads is a part of its own; one
        # a later op reads joins that op's part, and one through `.detach()` or `.data` is a plain effect (below)
        for node, effect in effects.items():
            if any(_input_requires_grad(example_inputs, i) for i in effect.rewrites_history) \
                    and _later_reader(node, effects, nodes, placeholders, part_of, roots) is None:
                roots.setdefault(part_of(node), [])
        if len([r for r in roots if r in differentiable or not roots[r]]) < 2:
            return None
    switches -= effects.keys()  # a value-less call that draws (an unused torch.rand) runs once, in one part
    first: dict = {}
    for position, n in enumerate(nodes):
        if _in(n, switches):
            first.setdefault(part_of(n), position)
    ordered = sorted(roots, key=first.__getitem__)
    members = {r: _reaching([returned[k] for k in roots[r]], handed) for r in ordered}
    for node in effects:  # a write or a draw no output reads stays, in its part (or the one it goes before)
        root = part_of(node)
        if root not in members:
            root = _home_of_effect(node, effects, nodes, placeholders, part_of, members) or ordered[0]
        members[root] |= _reaching([node], handed)
    handed_in = _handed_in(ordered, members, nodes, switches, handed)
    ordered = _producers_first(ordered, members, handed_in)
    if ordered is None:
        return None
    if not _apart(members, effects, placeholders, ordered, {n: k for k, n in enumerate(nodes)}) \
            or _recomputes_a_written_tensor(members, placeholders):
        return None
    if where_edges_differ and not (_all_in_parts(nodes, members, switches)
                                   and _edges_differ(members, roots, returned, placeholders, example_inputs)):
        return None
    handed_out = {r: [n for n in nodes if n in members[r] and any(n in handed_in[c] for c in ordered)]
                  for r in ordered}
    parts = [_part_graph(gm, nodes, switches, members[r], roots[r], handed_in[r], handed_out[r]) for r in ordered]
    return Split(parts, returned_inputs, constants, len(returned))


def _handed_in(ordered: list, members: dict, nodes: list, switches: set, handed: Callable) -> dict:
    """Per part, the values computed outside it that it reads (in `nodes`' order). A value no part computes (a
    constant `torch.tensor(2049)` whose only reader is across a handed edge) joins the first part reading it."""
    def outside(r) -> list:
        return [n for n in nodes if _in(n, switches) and n not in members[r]
                and any(n in m.all_input_nodes for m in members[r])]

    while True:
        computed = set().union(*members.values())
        orphan = next(((r, n) for r in ordered for n in outside(r) if n not in computed), None)
        if orphan is None:
            return {r: outside(r) for r in ordered}
        members[orphan[0]] |= _reaching([orphan[1]], handed)


def _producers_first(ordered: list, members: dict, handed_in: dict) -> list | None:
    """The parts in `ordered`'s order, except that a part computing a value another reads runs before it; None
    where parts read each other's values (they meet both ways: not apart)."""
    producer = {n: r for r in ordered for n in members[r]}
    needs = {r: {producer[n] for n in handed_in[r]} for r in ordered}
    done: list = []
    while len(done) < len(ordered):
        ready = [r for r in ordered if r not in done and needs[r] <= set(done)]
        if not ready:
            return None
        done.append(ready[0])
    return done


def _edges_differ(members: dict, roots: dict, returned, placeholders: list, example_inputs: list) -> bool:
    """Whether the parts giving differentiable outputs (or writing an input that requires grad: a part without
    outputs) read different sets of the inputs that require grad. One backward node for all of them has an edge
    to every such input, and a backward through one output walks (runs and frees) the history of inputs only
    another output is computed from, where eager's never reaches it."""
    def edges(part: set) -> frozenset[int]:
        read = {a for n in part for a in n.all_input_nodes}
        return frozenset(k for k, p in enumerate(placeholders) if p in read and _input_requires_grad(example_inputs, k))

    return len({edges(members[r]) for r in members
                if not roots[r] or any(_requires_grad(returned[k]) for k in roots[r])}) > 1


def _all_in_parts(nodes: list, members: dict, switches: set) -> bool:
    """Whether every computing node is in a part: a computation in none (a dead op that raises in eager) keeps
    the graph whole, where the check of what eager raises sees it."""
    in_parts = set().union(*members.values()) | switches
    return not any(n.op == "call_function" and n not in in_parts for n in nodes)


def _input_requires_grad(example_inputs: list, i: int) -> bool:
    return isinstance(example_inputs[i], torch.Tensor) and example_inputs[i].requires_grad


def _home_of_effect(node, effects: dict, nodes: list, placeholders: list, part_of: Callable, members: dict):
    """The part a write or draw that no output reads runs in, keeping its place in eager's order: the part of
    the first later node reading an input it writes (`x.mul_(0.9)` whose result nothing reads, then `y - x`), else
    of the first later computing node of a part, else of the last earlier one (`counter += 1` at the end)."""
    reader = _later_reader(node, effects, nodes, placeholders, part_of, members)
    if reader is not None:
        return reader
    at = nodes.index(node)
    later = [n for n in nodes[at + 1:] if _in(n, set()) and part_of(n) in members]
    earlier = [n for n in nodes[:at] if _in(n, set()) and part_of(n) in members]
    home = (later or earlier[::-1] or [None])[0]
    return None if home is None else part_of(home)


def _later_reader(node, effects: dict, nodes: list, placeholders: list, part_of: Callable, parts) -> object | None:
    """The part (among `parts`) of the first node after `node` that reads an input `node` writes, or None."""
    written = {placeholders[i] for i in effects[node].written}
    for n in nodes[nodes.index(node) + 1:]:
        if _in(n, set()) and part_of(n) in parts and written & set(n.all_input_nodes):
            return part_of(n)
    return None


def _apart(members: dict, effects: dict, placeholders: list, ordered: list, position: dict) -> bool:
    """Whether at most one part draws random numbers, and every input one part writes is read by another only
    where the split keeps eager's values: the reading part runs before the writing one and has computed all it
    computes before the first write (a module's running statistics read, then updated by the module after)."""
    def writes(n) -> set[int]:
        return effects[n].written if n in effects else set()

    drawing = [r for r, nodes in members.items() if any(n in effects and effects[n].draws for n in nodes)]
    if len(drawing) > 1:
        return False
    reads = {r: {a for n in nodes for a in n.all_input_nodes} for r, nodes in members.items()}
    for root, nodes in members.items():
        for i in {i for n in nodes for i in writes(n)}:
            first_write = min(position[n] for n in nodes if i in writes(n))
            for r, read in reads.items():
                if r is not root and placeholders[i] in read and not (
                        ordered.index(r) < ordered.index(root)
                        and max(position[n] for n in members[r]) < first_write):
                    return False
    return True


def _recomputes_a_written_tensor(members: dict, placeholders: list) -> bool:
    """Whether a part computes a tensor (or a view of one) that another part writes in place. Each part computes
    what it reads from the inputs on its own, so a value two parts share is computed twice: the part that writes
    it (`t0 = x._neg_view(); t0[0].zero_()`) writes its own copy, and the other (`t0.detach() * 2`) read the
    value from before the write (fuzz seed 600639). Inputs are `_apart`'s: they are not computed by any part."""
    inputs = {_storage(p) for p in placeholders} - {None}
    written = {r: {_storage(n.args[0]) for n in nodes if in_place_call(n) and n.args} - inputs - {None}
               for r, nodes in members.items()}
    return any(r is not other and _storage(n) in storages
               for r, storages in written.items() if storages
               for other, nodes in members.items() for n in nodes)


def _storage(node):
    """The storage of `node`'s value as the capture computed it (shared by its views), or None."""
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value.untyped_storage()._cdata if isinstance(value, torch.Tensor) else None


def _union_parts(nodes: list, switches: set, handed: Callable) -> Callable:
    """A find function: each computing node to its part's root. Inputs and constants (placeholders, get_attr)
    join nothing: two parts reading one input stay two parts, as eager's nodes of each are their own; nor do
    the edges `handed` names (a value one part may hand another)."""
    parent: dict = {}

    def find(n):
        while parent.get(n, n) is not n:
            parent[n] = parent.get(parent[n], parent[n])
            n = parent[n]
        return n

    for n in nodes:
        if n.op in ("placeholder", "get_attr", "output") or n in switches:
            continue
        parent.setdefault(n, n)
        for arg in n.all_input_nodes:
            if arg.op not in ("placeholder", "get_attr") and not handed(arg, n):
                parent[find(arg)] = find(n)
    return find


def _in(node, switches: set) -> bool:
    """Whether `node` computes (not an input, a constant, a switch or the output)."""
    return node.op not in ("placeholder", "get_attr", "output") and node not in switches


def _reaching(returned: list, handed: Callable) -> set:
    """The computing nodes the `returned` ones are computed from (a pure node no output reads is left out), up to
    the values `handed(arg, node)` says are handed over from another part."""
    seen, todo = set(), list(returned)
    while todo:
        n = todo.pop()
        if n not in seen and n.op not in ("placeholder", "get_attr"):
            seen.add(n)
            todo.extend(arg for arg in n.all_input_nodes if not handed(arg, n))
    return seen


def _requires_grad(node) -> bool:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.requires_grad


def _part_graph(gm, nodes: list, switches: set, members: set, outputs: list[int], handed_in: list,
                handed_out: list) -> Part:
    """The part of `gm` made of `members`, giving `outputs`: the inputs it reads and the values handed to it, the
    switches, its nodes in `gm`'s order, and its outputs and the values it hands on."""
    returned = nodes[-1].args[0]
    read = {a for n in members for a in n.all_input_nodes}
    graph = torch.fx.Graph()
    env: dict = {}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    inputs = [k for k, p in enumerate(placeholders) if p in read]
    for p in placeholders:
        if p in read:
            env[p] = graph.node_copy(p)
    for n in handed_in:
        env[n] = graph.placeholder(n.name)
        env[n].meta = dict(n.meta)
    keep = members | switches | {n for n in read if n.op == "get_attr"}
    for n in nodes:
        if n in keep:
            env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(tuple(env[returned[k]] for k in outputs) + tuple(env[n] for n in handed_out))
    part = torch.fx.GraphModule(gm, graph)
    part.meta = dict(gm.meta)
    return Part(part, inputs, outputs, handed_in, handed_out)


@dataclass
class Effect:
    """What one node of a graph does besides computing its value: the inputs whose storage it writes (positions),
    those of them it gives a new autograd history (written through a tensor that requires grad, grad mode on; not
    through `.detach()` or `.data`), and whether it draws random numbers."""

    written: set[int]
    rewrites_history: set[int]
    draws: bool


class _Effects(TorchDispatchMode):
    """Records, per node of a graph run under it (`node`, set by the interpreter), the storages its ATen ops
    write into (and through a tensor that requires grad), and whether they draw random numbers."""

    def __init__(self):
        super().__init__()
        self.node = None
        self.found: dict = {}  # node -> (storages written, storages given a new history, draws)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written, rewritten = set(), set()
        for t in tree_leaves(written_arguments(func._schema, args, kwargs)):
            if isinstance(t, torch.Tensor):
                written.add(t.untyped_storage()._cdata)
                if t.requires_grad and torch.is_grad_enabled():
                    rewritten.add(t.untyped_storage()._cdata)
        draws = _SEEDED in func.tags
        if written or draws:
            storages, histories, drew = self.found.get(self.node, (set(), set(), False))
            self.found[self.node] = (storages | written, histories | rewritten, drew or draws)
        return func(*args, **kwargs)


class _Interpreter(torch.fx.Interpreter):
    def __init__(self, gm, effects: _Effects):
        super().__init__(gm)
        self.effects = effects

    def run_node(self, n):
        self.effects.node = n
        return super().run_node(n)


def _effects(gm: torch.fx.GraphModule, example_inputs: list) -> dict | None:
    """Per node that writes or draws: (the positions of the inputs whose storage it writes, whether it draws);
    None where the fake run cannot go through the graph (data-dependent sizes, ...)."""
    effects = _Effects()
    try:
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
            storages = [x.untyped_storage()._cdata if isinstance(x, torch.Tensor) else None for x in fakes]
            with effects:
                _Interpreter(gm, effects).run(*fakes)
    except Exception:
        return None
    def positions(found: set) -> set[int]:
        return {i for i, s in enumerate(storages) if s in found}

    return {node: Effect(positions(written), positions(rewritten), draws)
            for node, (written, rewritten, draws) in effects.found.items()}


class PartsCompiled:
    """The parts compiled one by one, called in `gm`'s order, their outputs put back in `gm`'s positions."""

    def __init__(self, split: Split, compile_part: Callable, example_inputs: list):
        self.parts = [(part, compile_part(part.gm, [example_inputs[i] for i in part.inputs]
                                          + [n.meta["example_value"] for n in part.handed_in]))
                      for part in split.parts]
        self.split = split

    def __call__(self, *args):
        result = [None] * self.split.num_outputs
        handed: dict = {}
        for part, compiled in self.parts:
            values = compiled(*[args[i] for i in part.inputs], *[handed[n] for n in part.handed_in])
            for k, value in zip(part.outputs, values):
                result[k] = value
            handed.update(zip(part.handed_out, values[len(part.outputs):]))
        for k, i in self.split.returned_inputs.items():
            result[k] = args[i]
        for k, value in self.split.constants.items():
            result[k] = value
        return tuple(result)

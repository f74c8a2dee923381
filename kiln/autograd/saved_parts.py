"""The parts of a compiled backward that read saved tensors, so that a backward through one part frees only its own.

A compiled graph is one autograd node for all its outputs; eager has a node per op, and a backward without
`retain_graph` frees the saved tensors of the nodes it ran, nothing else. When the node frees every saved tensor
at the first backward, a later backward through another output (the user's `loss.backward()` inside the compiled
function, then a backward through an output computed beside the loss) finds them gone and raises "backward
through the graph a second time", where eager's nodes of that output still hold theirs.

The backward graph tells which gradients meet where a saved tensor is read: an op that reads a saved tensor
(directly, or through ops that read no gradient) and whose inputs depend on the gradients of several outputs
is, in eager, one node that a backward through any of them runs and frees. Outputs joined by such ops form a
part; the saved tensors each part reads are its own. A sum of gradient contributions that reads nothing saved
(the accumulation into a parameter used by two outputs) joins nothing: eager's engine sums those.

Eager's nodes hold more than tensors: `a * 2`'s node saves its scalar, and a second backward through it raises as
well. So an op of the backward that depends on several outputs' gradients joins them wherever eager's node of it
would save something: unless it only moves or sums gradients (`PASSES_GRADIENTS`: the engine's accumulation, a view's
or an expand's backward), and a part that runs such an op is freed like one that reads a saved tensor.

A backward frees the parts whose outputs it gives a gradient, and a later backward that needs a freed part
raises eager's error; one that needs only parts still held runs, with zeros in place of the freed tensors the
graph still takes (the values computed from them belong to outputs without a gradient in this backward, which
`absent_tangents` replaces by zeros).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kiln.autograd.saved_versions import OVERWRITTEN

SECOND_BACKWARD_ERROR = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they have "
    "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
    "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if "
    "you need to access saved tensors after calling backward.")


aten = torch.ops.aten
# Backward ops whose eager node saves nothing (a sum of gradient contributions, a view's or an expand's backward): a
# second backward through them alone runs in eager.
PASSES_GRADIENTS = frozenset({
    aten.add.Tensor, aten.sub.Tensor, aten.neg.default, aten.sum.dim_IntList, aten.sum.default, aten.view.default,
    aten._unsafe_view.default, aten.reshape.default, aten.expand.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.unsqueeze.default, aten.slice.Tensor, aten.select.int, aten.as_strided.default, aten.clone.default,
    aten.alias.default, aten.slice_backward.default, aten.select_backward.default, aten.cat.default,
    aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.stack.default,
})


@dataclass(frozen=True)
class SavedParts:
    """`part_of[k]`: the part of tangent k; `readers[j]`: the parts reading saved tensor j (positions among the
    saved tensors, sizes left out); `with_saved`: the parts that read a saved tensor or run an op whose eager
    node saves something (the parts a backward frees)."""

    part_of: tuple[int, ...]
    readers: tuple[frozenset[int], ...]
    with_saved: frozenset[int]


def saved_parts(backward: torch.fx.GraphModule, saved_is_size: list[bool], num_tangents: int) -> SavedParts | None:
    """The parts of `backward` (placeholders: the saved values, then the tangents); None where all its tangents
    are one part, or no part reads a saved tensor (the node's saved tensors are then freed at once)."""
    placeholders = list(backward.graph.find_nodes(op="placeholder"))
    num_saved = len(placeholders) - num_tangents
    tensor_position, count = {}, 0
    for node, is_size in zip(placeholders[:num_saved], saved_is_size):
        if not is_size:
            tensor_position[node] = count
            count += 1
    tangents_of = {t: frozenset((k,)) for k, t in enumerate(placeholders[num_saved:])}
    saved_under: dict = {n: frozenset((j,)) for n, j in tensor_position.items()}
    parent = list(range(num_tangents))
    reads: list[tuple[int, frozenset[int]]] = []  # (a tangent of the reading op, the saved tensors it reads)
    for node in backward.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        inputs = node.all_input_nodes
        tangents = frozenset().union(*(tangents_of.get(a, frozenset()) for a in inputs))
        saved = frozenset().union(*(saved_under.get(a, frozenset()) for a in inputs if not tangents_of.get(a)))
        if not tangents:
            saved_under[node] = saved
            continue
        tangents_of[node] = tangents
        holds = node.op == "call_function" and node.target not in PASSES_GRADIENTS
        if saved or holds:
            first = min(tangents)
            for k in tangents:
                _join(parent, first, k)
            reads.append((first, saved))
    part_of = tuple(_root(parent, k) for k in range(num_tangents))
    readers = [set() for _ in range(count)]
    for tangent, saved in reads:
        for j in saved:
            readers[j].add(part_of[tangent])
    with_saved = frozenset(part_of[tangent] for tangent, _ in reads)
    if len(set(part_of)) < 2 or not with_saved:
        return None
    return SavedParts(part_of, tuple(frozenset(r) for r in readers), with_saved)


def _root(parent: list[int], k: int) -> int:
    while parent[k] != k:
        parent[k] = parent[parent[k]]
        k = parent[k]
    return k


def _join(parent: list[int], a: int, b: int) -> None:
    parent[_root(parent, b)] = _root(parent, a)


class HeldSaved:
    """The saved tensors of one call, held per part: what a backward without `retain_graph` frees is the saved
    tensors that only the parts it ran read. Kept on the autograd ctx beside `save_for_backward`, whose copies
    (and version check) serve until the engine frees them."""

    def __init__(self, parts: SavedParts, saved: list):
        self.parts = parts
        # detached: no history, so no reference cycle through a saved output's grad_fn back to the ctx
        self.tensors: list = [t.detach() for t in saved]
        self.versions = [t._version for t in saved]
        self.freed: set[int] = set()

    def take(self, present: list[int], from_autograd: Callable[[], list]) -> list:
        """The saved tensors for a backward giving gradients to tangents `present`: autograd's (checked) where it
        still holds them, else this call's own, version-checked, with zeros for those freed; eager's error where a
        part the backward runs was freed. Frees what only the parts run read, unless the graph is retained."""
        running = {self.parts.part_of[k] for k in present}
        if running & self.freed:
            raise RuntimeError(SECOND_BACKWARD_ERROR)
        try:
            tensors = from_autograd()
        except RuntimeError as e:
            freed = "backward through the graph a second time" in str(e)
            if not freed and ("modified by an inplace operation" not in str(e) or self._written_read_by(running)):
                raise
            # freed by an earlier backward, or written since but read only by parts this backward skips (eager's
            # nodes of those outputs never run, and never check their saved tensors)
            tensors = [self._checked(j, running) for j in range(len(self.tensors))]
        if not _keeps_graph():
            self.freed |= running & self.parts.with_saved
            for j, readers in enumerate(self.parts.readers):
                if readers <= self.freed and isinstance(self.tensors[j], torch.Tensor):
                    t = self.tensors[j]
                    self.tensors[j] = (t.shape, t.stride(), t.dtype, t.device)
        return tensors

    def _written_read_by(self, running: set[int]) -> bool:
        """Whether a saved tensor that one of the `running` parts reads was written in place since the forward."""
        return any(self._overwritten(j, running) for j in range(len(self.tensors)))

    def _overwritten(self, j: int, running: set[int]) -> bool:
        """Whether saved tensor j, held (not freed) and read by one of the `running` parts, was written since."""
        t = self.tensors[j]
        return isinstance(t, torch.Tensor) and t._version != self.versions[j] and bool(self.parts.readers[j] & running)

    def _checked(self, j: int, running: set[int]):
        """Saved tensor j as this call holds it: a freed one's zeros, or the tensor, unless written since and read
        by one of the `running` parts."""
        t = self.tensors[j]
        if not isinstance(t, torch.Tensor):
            shape, stride, dtype, device = t
            return torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()
        if self._overwritten(j, running):
            raise RuntimeError(OVERWRITTEN.format(tensor=f"{t.type()} {list(t.shape)}", which="", now=t._version,
                                                  then=self.versions[j]))
        return t


def _keeps_graph() -> bool:
    """Whether the running backward retains the graph (`retain_graph=True`, `create_graph=True`); True outside the
    engine's backward (a backward graph compiled autograd traced, run later), which frees nothing here."""
    return torch._C._autograd._get_current_graph_task_keep_graph()

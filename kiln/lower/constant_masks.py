"""Attention masks that mask nothing, dropped from the captured graph before it is traced.

Model code written for compilers builds its attention mask in the graph even where eager skips it:
Hugging Face's encoders check `padding_mask.all()` in eager and pass no mask to
`scaled_dot_product_attention`, but under a compiler (`torch.compiler.is_compiling()`) they avoid that
data-dependent check and always pass a full mask, often made from nothing but the sizes
(`torch.ones` of the batch's shape, compared and expanded). ATen runs fused attention (cuDNN, flash)
without a mask and falls to the unfused math kernels (fp32 score matrices) with one, so the compiled
model ends up slower than eager. The choice is made when the autograd stage traces the graph, so it is
made here, on the captured graph: a mask computed from no input, parameter or random draw is evaluated
once; if it masks nothing (all True, or all zeros for an additive mask) it is replaced by None. Its value
depends only on the graph's static sizes and constants, which the graph's guards already pin.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F

ATTENTION = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)
MASK_POSITION = 3  # attn_mask, when passed positionally
# Ops whose value is not a function of their arguments: a mask made with one is never folded.
UNREPEATABLE = ("rand", "normal", "bernoulli", "dropout", "empty", "multinomial", "poisson", "exponential")


def drop_masks_that_mask_nothing(gm: torch.fx.GraphModule) -> int:
    """Replace every constant all-pass attention mask of `gm` by None; the number replaced."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in ATTENTION:
            continue
        mask = node.kwargs.get("attn_mask", node.args[MASK_POSITION] if len(node.args) > MASK_POSITION else None)
        if not isinstance(mask, torch.fx.Node):
            continue
        computation = _input_free_computation(mask)
        if computation is None:
            continue
        value = _evaluate(gm, computation, mask)
        if not (_masks_nothing(value) and _eager_accepts(node, value)):
            continue
        if "attn_mask" in node.kwargs:
            node.update_kwarg("attn_mask", None)
        else:
            node.update_arg(MASK_POSITION, None)
        _erase_unused(gm.graph, computation)
        dropped += 1
    if dropped:
        gm.recompile()
    return dropped


def _input_free_computation(mask: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes computing `mask`, in graph order, when none reads an input, a parameter or attribute, or
    draws random numbers, and every size is static; else None."""
    seen: dict[torch.fx.Node, None] = {}
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        if node.op not in ("call_function", "call_method") or not _repeatable(node) or _symbolic(node):
            return None
        seen[node] = None
        stack.extend(node.all_input_nodes)
    order = {n: k for k, n in enumerate(mask.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _repeatable(node: torch.fx.Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return not any(word in name for word in UNREPEATABLE) and not name.endswith("_")


def _symbolic(node: torch.fx.Node) -> bool:
    value = _example(node)
    return isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape)


def _evaluate(gm: torch.fx.GraphModule, computation: list[torch.fx.Node], mask: torch.fx.Node):
    """The mask's value, computed by a graph of just `computation` (None if that raises)."""
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in computation:
        copies[node] = graph.node_copy(node, copies.__getitem__)
    graph.output(copies[mask])
    try:
        with torch.no_grad():
            return torch.fx.GraphModule(gm, graph)()
    except Exception:  # a mask kiln cannot evaluate here stays as it is
        return None


def _masks_nothing(mask) -> bool:
    if not isinstance(mask, torch.Tensor):
        return False
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return mask.is_floating_point() and not bool(mask.any())


def _eager_accepts(node: torch.fx.Node, mask: torch.Tensor) -> bool:
    """Whether eager takes `mask` without raising: a boolean mask or one of the query's dtype, broadcastable
    to the score matrix's shape. A mask eager rejects stays, so that the compiled call raises too."""
    query, key = (_example(a) for a in node.args[:2])
    if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)):
        return False
    if mask.dtype not in (torch.bool, query.dtype):
        return False
    scores = tuple(query.shape[:-1]) + (key.shape[-2],)
    try:
        return torch.broadcast_shapes(tuple(mask.shape), scores) == scores
    except RuntimeError:
        return False


def _example(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def _erase_unused(graph: torch.fx.Graph, computation: list[torch.fx.Node]) -> None:
    for node in reversed(computation):
        if not node.users:
            graph.erase_node(node)

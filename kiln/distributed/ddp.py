"""DistributedDataParallel: the compiled forward split at DDP's gradient buckets.

DDP all-reduces gradients bucket by bucket, a bucket being parameters in reverse registration order up to
`bucket_cap_mb` (the first bucket smaller). Its reducer starts a bucket's all-reduce when the last gradient
of that bucket is ready. A compiled forward is one autograd node whose backward produces every gradient at
its end, so no all-reduce could start before the whole backward has run. Splitting the captured graph into
one subgraph per bucket gives each its own backward: the gradients of the last layers' bucket are ready,
and their all-reduce runs, while the backward of earlier layers still computes (torch.compile's "DDP
optimizer" does the same).

`split_at_ddp_buckets(backend)` wraps any backend: a graph captured while a DDP forward runs (DDP marks its
module active around the inner call) is split; other graphs reach the backend unchanged. DDP's own forward
(`_pre_forward`, `_post_forward`, buffer broadcast) stays eager: `kiln.compile(DDP(m))` compiles the inner
module's forward (`compiled_inner_module`), as `DDP(kiln.compile(m))` does.
"""
from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx
from torch import nn
from torch.fx.passes.split_module import split_module

from kiln.config import config
from kiln.runtime.compile_lock import compile_lock

log = logging.getLogger("kiln.ddp")  # KILN_LOGS=ddp

Backend = Callable[[torch.fx.GraphModule, list], Callable]

try:
    from torch.nn.parallel import DistributedDataParallel
except ImportError:  # a torch built without torch.distributed
    DistributedDataParallel = None


def active_ddp_module() -> nn.Module | None:
    """The DDP module whose forward is running now (DDP sets it around its call of the inner module), if any."""
    if DistributedDataParallel is None:
        return None
    return DistributedDataParallel._get_active_ddp_module()


def compiled_inner_module(module: nn.Module) -> nn.Module | None:
    """The module whose forward kiln compiles when `kiln.compile(module)` is given a DDP wrapper: its inner
    module (DDP's own forward, with its hooks and collectives, runs natively around it); None otherwise."""
    if DistributedDataParallel is not None and isinstance(module, DistributedDataParallel):
        return module.module
    return None


@dataclass
class Bucket:
    """The nodes of one subgraph and the bytes of the DDP parameters they read first (in reverse order)."""

    nodes: list[torch.fx.Node] = field(default_factory=list)
    params: list[str] = field(default_factory=list)
    size: int = 0


def bucket_caps(ddp: nn.Module) -> tuple[int, int]:
    """(first bucket's cap, other buckets' cap) in bytes, as DDP's reducer sizes them."""
    config = getattr(ddp, "_bucket_config", None)
    if config is not None:
        return config.first_bucket_bytes_cap, config.bucket_bytes_cap
    # older DDP: the first bucket is small only with the default bucket_cap_mb
    first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if ddp.bucket_bytes_cap_default else ddp.bucket_bytes_cap
    return min(first, ddp.bucket_bytes_cap), ddp.bucket_bytes_cap


def reduced_parameters(ddp: nn.Module) -> set[int]:
    """Ids of the parameters whose gradients DDP all-reduces (it skips frozen and ignored ones)."""
    ignored = getattr(ddp, "parameters_to_ignore", set())
    return {id(p) for name, p in ddp.module.named_parameters() if p.requires_grad and name not in ignored}


def assign_buckets(gm: torch.fx.GraphModule, example_inputs: list, reduced: set[int], first_cap: int,
                   cap: int) -> list[Bucket]:
    """Walk the graph from its end, adding each DDP parameter to the bucket of its last user; a bucket that
    has reached its cap closes before the next node. Returned in graph order (the first bucket last)."""
    params = {node: example for node, example in zip(gm.graph.find_nodes(op="placeholder"), example_inputs)
              if isinstance(example, nn.Parameter) and id(example) in reduced}
    buckets = [Bucket()]
    seen: set[torch.fx.Node] = set()
    boundaries = split_points(gm)
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        current = buckets[0]
        if current.size >= (first_cap if len(buckets) == 1 else cap) and node in boundaries:
            current = Bucket()
            buckets.insert(0, current)
        for arg in node.all_input_nodes:
            if arg in params and arg not in seen:
                seen.add(arg)
                current.params.append(arg.target)
                current.size += params[arg].numel() * params[arg].element_size()
        current.nodes.append(node)
    if len(buckets) > 1 and buckets[0].size == 0:  # the nodes before the first parameter's user
        buckets[1].nodes += buckets.pop(0).nodes
    return buckets


def split_points(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes after which the graph may be split: outside every grad-mode and autocast region.

    Each subgraph is compiled on its own, and a backend compiles a region's switches with the graph that
    holds them: a subgraph must not start or end inside a `torch.no_grad()` or autocast block of the user's.
    The grad mode at the graph's end is its mode at entry (capture restores it last).
    """
    grad_switches = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch._C._set_grad_enabled]
    entry_mode = grad_switches[-1].args[0] if grad_switches else None
    mode, autocast_depth, points = entry_mode, 0, set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            mode = node.args[0]
        elif node.op == "call_function" and node.target is torch.amp._enter_autocast:
            autocast_depth += 1
        elif node.op == "call_function" and node.target is torch.amp._exit_autocast:
            autocast_depth -= 1
        if mode == entry_mode and autocast_depth == 0:
            points.add(node)
    return points


def split_at_ddp_buckets(backend: Backend) -> Backend:
    """`backend`, splitting each graph captured inside a DDP forward at DDP's bucket boundaries."""
    return DDPBucketing(backend)


class DDPBucketing:
    """A backend that splits graphs captured inside a DDP forward and hands the rest to `backend` unchanged.
    Its other attributes (`name`, `options`) are the wrapped backend's, for reports and the debug directory."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.__name__ = getattr(backend, "__name__", type(backend).__name__)
        self.__wrapped__ = backend  # inspect.unwrap: what the user passed (a repro script names it)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["backend"], name)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        ddp = active_ddp_module()
        if ddp is None or not config.optimize_ddp:
            return self.backend(gm, example_inputs)
        first_cap, cap = bucket_caps(ddp)
        buckets = assign_buckets(gm, example_inputs, reduced_parameters(ddp), first_cap, cap)
        gm.meta["kiln.ddp_buckets"] = [list(b.params) for b in buckets]
        log.info("DDP graph of %s split into %d buckets (cap %d bytes, first %d): %s", gm.meta.get("frame", "?"),
                 len(buckets), cap, first_cap, [b.params for b in buckets])
        if len(buckets) == 1:
            return self.backend(gm, example_inputs)
        return split_graph(gm, buckets, self.backend)


def split_graph(gm: torch.fx.GraphModule, buckets: list[Bucket], backend: Backend) -> torch.fx.GraphModule:
    """One subgraph per bucket, each compiled by `backend` on its first call (its inputs then are real
    tensors, as the backend contract asks), called in order by the returned graph."""
    partition = {node: index for index, bucket in enumerate(buckets) for node in bucket.nodes}
    split = split_module(gm, None, lambda node: partition[node], keep_original_order=True)
    originals = {node.name: node for node in gm.graph.nodes}
    for node in list(split.graph.find_nodes(op="call_module")):
        submodule = getattr(split, node.target)
        _copy_input_meta(submodule, originals)
        single = _outputs_as_tuple(submodule)
        submodule.meta = dict(gm.meta, **{"kiln.ddp_bucket": node.target})
        node.op, node.target = "call_function", CompiledOnFirstCall(submodule, backend, node.target)
        if single:
            _unpack_single_output(split.graph, node)
        delattr(split, node.target.name)
    split.graph.lint()
    split.recompile()
    return split


def _copy_input_meta(submodule: torch.fx.GraphModule, originals: dict[str, torch.fx.Node]) -> None:
    """A subgraph's placeholders carry the meta (fake values, sources) of the nodes they stand for."""
    for placeholder in submodule.graph.find_nodes(op="placeholder"):
        original = originals.get(placeholder.name)
        if original is not None:
            placeholder.meta = dict(original.meta)


def _outputs_as_tuple(submodule: torch.fx.GraphModule) -> bool:
    """Make the subgraph return a tuple, as a captured graph does; True if it returned a single value."""
    output = next(iter(submodule.graph.find_nodes(op="output")))
    if isinstance(output.args[0], (tuple, list)):
        return False
    output.args = ((output.args[0],),)
    submodule.recompile()
    return True


def _unpack_single_output(graph: torch.fx.Graph, call: torch.fx.Node) -> None:
    with graph.inserting_after(call):
        item = graph.call_function(operator.getitem, (call, 0))
    call.replace_all_uses_with(item, delete_user_cb=lambda user: user is not item)


class CompiledOnFirstCall:
    """One bucket's subgraph, compiled by the backend with the real inputs of its first call."""

    def __init__(self, gm: torch.fx.GraphModule, backend: Backend, name: str):
        self.gm, self.backend, self.name = gm, backend, name
        self.compiled: Callable | None = None
        self.__name__ = name

    def __call__(self, *args):
        if self.compiled is None:
            with compile_lock:
                if self.compiled is None:
                    self.compiled = self.backend(self.gm, list(args))
        return self.compiled(*args)

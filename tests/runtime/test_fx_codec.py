"""kiln/runtime/fx_codec.py: an ATen graph as JSON and back, for the AOT autograd cache. The rebuilt graph prints
the same code, carries the same node values (as fake tensors) and computes the same results; what the description
cannot name safely is refused, and a description that does not rebuild its stored code is rejected."""
from __future__ import annotations

import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.runtime.fx_codec import decode_graph, encode_graph
from kiln.runtime.graph_cache import Uncacheable
from kiln.runtime.lazy_graphs import source


def _norm_and_split(x, w):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w[0])  # a multi-output op read through getitem
    a, b = y.split([2, 3], dim=-1)  # list arguments, tuple results
    return a.to(torch.float64).sum(dim=(0,), keepdim=True), b.t().contiguous(memory_format=torch.contiguous_format)


def _constants_and_scalars(x, w):
    mask = torch.tensor([True, False, True, True, False])  # a tensor constant (get_attr)
    return torch.where(mask, x.clamp(min=-float("inf"), max=0.5), x * 2.5).masked_fill(x > 1e30, float("nan")) @ w.T


def _views(x, w):
    return x[1:, ::2].unsqueeze(0).expand(2, -1, -1).mean(-1), torch.zeros(3, dtype=torch.int64, device="cpu")


CASES = [_norm_and_split, _constants_and_scalars, _views]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_a_graph_round_trips_through_json(fn):
    x, w = torch.randn(4, 5), torch.randn(5, 5)
    gm = make_fx(fn, tracing_mode="fake")(x, w)
    described = json.loads(json.dumps(encode_graph(gm)))  # what the cache file holds
    rebuilt = decode_graph(described, FakeTensorMode())
    # printed once to be checked, and not compiled: the cache key reads that printing, a call compiles it
    assert type(rebuilt).forward is type(rebuilt)._lazy_forward and source(rebuilt) == gm.code
    assert rebuilt.code == gm.code
    for old, new in zip(gm.graph.nodes, rebuilt.graph.nodes):
        if isinstance(old.meta.get("val"), torch.Tensor):
            assert isinstance(new.meta["val"], FakeTensor)
            assert (new.meta["val"].shape, new.meta["val"].stride(), new.meta["val"].dtype) == \
                (old.meta["val"].shape, old.meta["val"].stride(), old.meta["val"].dtype)
    torch.testing.assert_close(rebuilt(x, w), fn(x, w), equal_nan=True)


def _python_helper(x):
    return x + 1


def test_a_call_of_a_python_function_is_not_described():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(_python_helper, (x,)))
    with pytest.raises(Uncacheable, match="_python_helper"):
        encode_graph(torch.fx.GraphModule(torch.nn.Module(), graph))


def _described():
    return json.loads(json.dumps(encode_graph(make_fx(_constants_and_scalars, tracing_mode="fake")(
        torch.randn(4, 5), torch.randn(5, 5)))))


def _first_call(described):
    return next(n for n in described["nodes"] if n["op"] == "call_function")


TAMPERING = {
    "another_operator": lambda d: _first_call(d)["target"].update(op="aten::neg.default"),
    "not_an_operator": lambda d: _first_call(d)["target"].update(op="os::system"),
    "a_private_operator_function": lambda d: _first_call(d).update(target={"operator": "__import__"}),
    "a_constant_renamed_to_a_path": lambda d: d.update(constants={"../x": next(iter(d["constants"].values()))}),
    "an_unknown_node_kind": lambda d: _first_call(d).update(op="call_module"),
}


@pytest.mark.parametrize("tamper", list(TAMPERING))
def test_a_description_that_does_not_rebuild_its_code_is_rejected(tamper):
    described = _described()
    TAMPERING[tamper](described)
    with pytest.raises((ValueError, AttributeError, RuntimeError)):
        decode_graph(described, FakeTensorMode())


def _size_arithmetic(x, w):
    half = x[: x.shape[0] // 2]  # sizes that are expressions of the batch's symbol, computed in the graph
    return torch.cat([half, x]).reshape(-1, 5) @ w, x.new_zeros(x.shape[0] * 2 + 1)


@pytest.mark.parametrize("fn", [*CASES, _size_arithmetic], ids=lambda f: f.__name__)
def test_a_graph_with_symbolic_sizes_round_trips_in_its_shape_environment(fn):
    from kiln.runtime import symbolic_sizes

    x, w = torch.randn(6, 5), torch.randn(5, 5)
    gm = make_fx(fn, tracing_mode="symbolic")(x, w)
    shape_env = symbolic_sizes.shape_env_of(n.meta["val"] for n in gm.graph.find_nodes(op="placeholder"))
    assert shape_env is not None
    guards = len(shape_env.guards)
    rebuilt = decode_graph(json.loads(json.dumps(encode_graph(gm))), FakeTensorMode(shape_env=shape_env))
    assert rebuilt.code == gm.code and len(shape_env.guards) == guards
    for old, new in zip(gm.graph.nodes, rebuilt.graph.nodes):
        if isinstance(old.meta.get("val"), torch.Tensor):
            assert [str(s) for s in new.meta["val"].shape] == [str(s) for s in old.meta["val"].shape]
    x = torch.randn(10, 5)  # another batch: the graph computes its sizes from its input
    torch.testing.assert_close(rebuilt(x, w), fn(x, w), equal_nan=True)

"""The AOT autograd cache (kiln/autograd/aot_cache.py): a captured graph traced once keeps its ATen graphs (forward
and backward, or inference) in the compile cache; a later compile of the same captured graph, in this process after
kiln.reset() or in a fresh one, does not trace, functionalize or partition, and computes what eager computes,
gradients and input mutations included. A broken entry is traced again. (A fresh process that starts warm from
saved artifacts, tracing nothing: tests/runtime/test_cache_warm.py, the deployment test.)"""
from __future__ import annotations

import json

import pytest
import torch

import kiln
from kiln.autograd import aot, aot_cache
from kiln.autograd.signature import FlatProgram
from kiln.runtime.graph_cache import Uncacheable
from kiln.runtime.private_files import publish, temp_name


class Block(torch.nn.Module):
    """Linear, LayerNorm, GELU and a residual: a training graph whose backward reads saved activations."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.norm(self.fc(x)))


class Normed(torch.nn.Module):
    """BatchNorm in training mode: the graph writes its running statistics (input mutations)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()


def _split_views(x, w):
    y = x @ w
    return y.chunk(2, dim=0), y.sum(), x[1:]  # multi-output views, a scalar, a view of an input


def _bump(x, w):
    x.add_(1)  # an input written in place
    return (x * w).sum(-1)


def _replayed_views(x):
    y = x * 2
    return y[1:].t(), x.view(-1)[2:], y.detach().unsqueeze(0)  # views replayed after the call (view_replay.py)


def _with_constant(x):
    return x * torch.tensor([1.5, -2.0, 0.25]) + x.sum()


def _dict_and_constant(x):
    return {"y": x.sin(), "rows": x.shape[0], "pair": (x.cos(), None)}  # a dict, an int, None: the output tree


def _module_case(make_model, shape):
    return make_model(), lambda: (torch.randn(*shape),)


CASES = {
    "module_training": lambda: _module_case(Block, (4, 8)),
    "batchnorm_training": lambda: _module_case(Normed, (2, 3, 6, 6)),
    "views_training": lambda: (_split_views, lambda: (torch.randn(4, 6, requires_grad=True), torch.randn(6, 5))),
    "replayed_views_training": lambda: (_replayed_views, lambda: (torch.randn(4, 6, requires_grad=True),)),
    "inference_input_mutation": lambda: (_bump, lambda: (torch.randn(3, 4), torch.randn(3, 4))),
    "tensor_constant": lambda: (_with_constant, lambda: (torch.randn(5, 3, requires_grad=True),)),
    "dict_and_constant": lambda: (_dict_and_constant, lambda: (torch.randn(3, 2, requires_grad=True),)),
}


def _state(fn):
    return {k: v.detach().clone() for k, v in fn.state_dict().items()} if isinstance(fn, torch.nn.Module) else {}


def _run(fn, args):
    """Outputs, gradients of what requires grad (inputs and parameters), inputs after the call, and the module's
    state after it (running statistics), for eager and compiled alike."""
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    for p in params:
        p.grad = None
    out = fn(*args)
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    grads = []
    if any(t.requires_grad for t in leaves):
        sum(t.float().sum() for t in leaves if t.requires_grad).backward()
        grads = [t.grad for t in [*args, *params] if t.requires_grad]
    return [t.detach() for t in leaves], grads, [a.detach() for a in args]


def _fresh(case):
    """The case's function (a model with its initial weights again) and inputs, the same each time."""
    torch.manual_seed(0)
    fn, make_args = CASES[case]()
    return fn, make_args()


@pytest.mark.parametrize("case", list(CASES))
def test_second_compile_takes_the_aot_graphs_from_the_cache_and_matches_eager(fresh_cache, monkeypatch, case):
    calls = []
    monkeypatch.setattr(aot, "trace_joint", _counting(aot.trace_joint, calls))
    monkeypatch.setattr(aot, "trace_forward", _counting(aot.trace_forward, calls))
    monkeypatch.setattr(FlatProgram, "analyze", _counting(FlatProgram.analyze, calls))
    results = []
    for _ in range(2):
        fn, args = _fresh(case)
        kiln.reset()
        hits, before = aot_cache.stats["hits"], len(calls)
        results.append((_run(kiln.compile(fn), args), aot_cache.stats["hits"] - hits, calls[before:]))
    fn, args = _fresh(case)
    expected = _run(fn, args)
    (cold, cold_hits, cold_calls), (warm, warm_hits, warm_calls) = results
    torch.testing.assert_close(cold, expected)
    torch.testing.assert_close(warm, expected)
    traced = [c for c in cold_calls if c.startswith("trace")]
    assert cold_hits == 0 and warm_hits == len(traced) >= 1, "every variant traced once, then from the cache"
    assert warm_calls == [], "a warm compile neither analyzes nor traces"


def _counting(fn, calls: list):
    def counted(*args, **kwargs):
        calls.append(fn.__name__)
        return fn(*args, **kwargs)
    return counted


@pytest.mark.parametrize("change", ["shape", "requires_grad", "option", "autocast"])
def test_a_different_variant_input_or_option_is_a_miss(fresh_cache, change):
    fn, args = _fresh("views_training")
    _run(kiln.compile(fn), args)
    kiln.reset()
    hits = aot_cache.stats["hits"]
    x, w = args
    options = None
    if change == "shape":
        args = (torch.randn(6, 6, requires_grad=True), w)
    elif change == "requires_grad":
        args = (x.detach(), w.requires_grad_(True))
    elif change == "option":
        options = {"epilogue_fusion": False}
    compiled = kiln.compile(fn, options=options)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=change == "autocast"):
        got = _run(compiled, args)
        expected = _run(fn, args)
    torch.testing.assert_close(got, expected)
    assert aot_cache.stats["hits"] == hits


def _entries(root):
    return [p for p in (root / aot_cache.FOLDER).rglob("*.json") if not p.name.endswith(".manifest.json")]


def _tamper(path, change, keep_manifest_valid: bool):
    data = change(path.read_bytes())
    if keep_manifest_valid:  # a product that passes the hash check but does not rebuild what it says
        tmp = temp_name(path)
        tmp.write_bytes(data)
        publish(tmp, path)
    else:
        path.write_bytes(data)


def _retarget_an_op(data: bytes) -> bytes:
    product = json.loads(data)
    for graph in product["graphs"].values():
        for node in graph["nodes"]:
            if node["op"] == "call_function" and node["target"].get("op") == "aten::mul.Tensor":
                node["target"]["op"] = "aten::add.Tensor"  # the code stored beside it still says mul
                return json.dumps(product).encode()
    raise AssertionError("no mul in the product")


DAMAGE = {
    "flipped_byte": (lambda d: d[:40] + bytes([d[40] ^ 1]) + d[41:], False),
    "truncated": (lambda d: d[: len(d) // 2], False),
    "empty": (lambda d: b"", False),
    "garbage_with_valid_manifest": (lambda d: b"{not json", True),
    "wrong_op_with_valid_manifest": (_retarget_an_op, True),
    "unknown_operator_with_valid_manifest": (lambda d: d.replace(b'"aten::mul.Tensor"', b'"os::system"', 1), True),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_traced_again_and_correct(fresh_cache, caplog, damage):
    fn, args = _fresh("tensor_constant")
    _run(kiln.compile(fn), args)
    (entry,) = _entries(fresh_cache)
    change, keep_manifest_valid = DAMAGE[damage]
    _tamper(entry, change, keep_manifest_valid)
    kiln.reset()
    hits = aot_cache.stats["hits"]
    fn, args = _fresh("tensor_constant")
    torch.testing.assert_close(_run(kiln.compile(fn), args), _run(fn, args))
    assert aot_cache.stats["hits"] == hits
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "rebuilding" in messages or "could not be used" in messages
    kiln.reset()  # traced again and stored anew: the next compile hits
    _run(kiln.compile(fn), args)
    assert aot_cache.stats["hits"] == hits + 1


def _user_helper(x):
    return x * 2


def test_a_captured_graph_calling_a_function_its_code_does_not_show_is_not_cached():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(_user_helper, (x,)))
    program = FlatProgram(torch.fx.GraphModule(torch.nn.Module(), graph), [torch.randn(3)])
    with pytest.raises(Uncacheable, match="_user_helper"):
        aot_cache.variant_key(program, (None, ()), "compiler")


def test_dynamic_shapes_are_traced_not_cached(fresh_cache):
    fn, args = _fresh("views_training")
    uncacheable = aot_cache.stats["uncacheable"]
    torch.testing.assert_close(_run(kiln.compile(fn, dynamic=True), args), _run(fn, args))
    assert aot_cache.stats["uncacheable"] > uncacheable


def _helper_graph() -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(_user_helper, (x,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _double_sin(x):
    return (x * 2).sin()


@pytest.mark.parametrize("make_graph, eager, cache, calls", [
    (lambda: torch.fx.symbolic_trace(_double_sin), _double_sin, "compiler", [1, 0]),  # traced, then from the cache
    (lambda: torch.fx.symbolic_trace(_double_sin), _double_sin, None, [1, 1]),  # nothing cached: traced each time
    (_helper_graph, _user_helper, "compiler", [0, 0]),  # traced each time (not cacheable), its products may be
])
def test_the_compiler_hears_before_a_trace_whose_products_will_be_built(fresh_cache, make_graph, eager, cache,
                                                                         calls):
    """`before_trace` (kiln's Triton build workers start there) is called where the compiler will build what the
    trace makes: not where the ATen graphs come from the cache, nor for a variant the AOT cache cannot keep,
    whose compiled products the compiler's own cache may still hold."""
    heard = []

    def compiler(gm, example_inputs):
        return gm

    compiler.before_trace = lambda: heard.append("trace")
    for expected in calls:
        heard.clear()
        compiled = aot.aot_compile(make_graph(), [torch.randn(3)], compiler, cache=cache)
        torch.testing.assert_close(compiled(torch.ones(3)), eager(torch.ones(3)))
        assert len(heard) == expected

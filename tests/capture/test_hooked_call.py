"""Forward hooks and pre-hooks on the compiled module itself (kiln/capture/hooked_call.py).

An accelerate-style model carries hooks on its root module. torch.compile traces `Module.__call__`, so the
hooks run inside its graph; kiln compiles the same call (hooks and forward) instead of running the hooked
module eagerly. Each case runs eagerly, through kiln and through torch.compile with a counting backend: kiln
must return what eager returns and capture no more graphs than torch.compile.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

import kiln
from kiln.api import context_of
from support.capture import CountingBackend, graph_count


class Printing(nn.Module):
    """A forward with a graph break in the middle."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        y = self.fc(x) * scale
        print("between graphs")
        return y.relu()


class Outer(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.fc = inner, nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(self.inner(x + 1))


def _pre_args(mod, args):
    return (args[0] * 2,)


def _pre_single(mod, args):
    return args[0] - 1  # not a tuple: torch wraps it


def _pre_kwargs(mod, args, kwargs):
    return args, {**kwargs, "scale": 3.0}


def _post(mod, args, out):
    return out + 1


def _post_kwargs(mod, args, kwargs, out):
    return out * kwargs.get("scale", 1.0)


def _post_observer(mod, args, out):
    mod.seen = mod.seen + 1 if hasattr(mod, "seen") else 1  # a side effect; returns None: the output is kept


HOOKS = {
    "pre": [("pre", _pre_args, False)],
    "pre_not_a_tuple": [("pre", _pre_single, False)],
    "pre_with_kwargs": [("pre", _pre_kwargs, True)],
    "forward": [("post", _post, False)],
    "forward_with_kwargs": [("post", _post_kwargs, True)],
    "observer": [("post", _post_observer, False)],
    "all": [("pre", _pre_args, False), ("pre", _pre_kwargs, True), ("post", _post, False),
            ("post", _post_kwargs, True), ("post", _post_observer, False)],
}


def _hook(module, hooks):
    for where, fn, with_kwargs in hooks:
        if where == "pre":
            module.register_forward_pre_hook(fn, with_kwargs=with_kwargs)
        else:
            module.register_forward_hook(fn, with_kwargs=with_kwargs)
    return module


def _linear():
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh())


def _compare(make, x, **kwargs):
    """Eager, kiln (counting backend) and torch.compile (counting backend) on identical modules: kiln's
    output and module state as eager's, its graph count at most torch's. Returns kiln's graph count."""
    torch.manual_seed(0)
    expected_module = make()
    expected = expected_module(x, **kwargs)
    counts, outputs = {}, {}
    for name, compile_ in (("kiln", kiln.compile), ("torch", torch.compile)):
        torch._dynamo.reset()
        torch.manual_seed(0)
        module = make()
        backend = CountingBackend()
        outputs[name] = compile_(module, backend=backend)(x, **kwargs)
        counts[name] = backend.graphs
        assert getattr(module, "seen", None) == getattr(expected_module, "seen", None), name
    torch.testing.assert_close(outputs["kiln"], expected)
    torch.testing.assert_close(outputs["torch"], expected)
    assert counts["kiln"] <= counts["torch"], counts
    return counts["kiln"]


@pytest.mark.parametrize("hooks", list(HOOKS))
def test_root_hooks_are_captured_in_one_graph(hooks):
    needs_kwargs = any(with_kwargs for _, _, with_kwargs in HOOKS[hooks])
    make = (lambda: _hook(Printing(), HOOKS[hooks])) if needs_kwargs else (lambda: _hook(_linear(), HOOKS[hooks]))
    if needs_kwargs:  # Printing breaks: its count is compared with torch's, not 1
        _compare(make, torch.randn(2, 4), scale=0.5)
    else:
        assert _compare(make, torch.randn(2, 4)) == 1


@pytest.mark.parametrize("hooks", ["pre", "forward", "all"])
def test_root_hooks_with_fullgraph(hooks):
    torch.manual_seed(0)
    module = _hook(_linear(), [h for h in HOOKS[hooks] if not h[2]])
    compiled = kiln.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), module(x))
    assert graph_count(context_of(compiled)) == 1


@pytest.mark.parametrize("hooks", ["pre", "forward_with_kwargs", "all"])
def test_break_inside_a_hooked_root_resumes_with_hooks_compiled(hooks):
    """A break in `forward` resumes after it inside the captured call: the later hooks are still compiled."""
    _compare(lambda: _hook(Printing(), HOOKS[hooks]), torch.randn(2, 4), scale=2.0)


@pytest.mark.parametrize("hooks", ["pre", "forward", "all"])
def test_break_inside_a_hooked_submodule(hooks):
    """A hooked submodule whose forward breaks runs natively as hooks plus a compiled forward."""
    _compare(lambda: Outer(_hook(Printing(), HOOKS[hooks])), torch.randn(2, 4))


def test_adding_and_removing_a_root_hook_recompiles():
    torch.manual_seed(0)
    module = _linear()
    compiled = kiln.compile(module, backend="eager")
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), module(x))
    handle = module.register_forward_hook(_post)
    torch.testing.assert_close(compiled(x), module(x))
    second = module.register_forward_pre_hook(_pre_args)
    torch.testing.assert_close(compiled(x), module(x))
    handle.remove()
    torch.testing.assert_close(compiled(x), module(x))
    second.remove()
    torch.testing.assert_close(compiled(x), module(x))
    records = context_of(compiled).records
    assert len(records) == 4, [r.recompile_reason for r in records]  # the last call reuses the first entry


def test_replacing_a_hook_in_place_recompiles():
    """The hook is read from the dict through its source: a different function under the same id is seen."""
    torch.manual_seed(0)
    module = _linear()
    handle = module.register_forward_hook(_post)
    compiled = kiln.compile(module, backend="eager")
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), module(x))
    module._forward_hooks[handle.id] = lambda mod, args, out: out * 5
    torch.testing.assert_close(compiled(x), module(x))


@pytest.mark.allows_fallback("graph_break: global module hooks are not inlined; each submodule call breaks")
def test_global_hooks_still_run():
    torch.manual_seed(0)
    module = _hook(_linear(), HOOKS["forward"])
    compiled = kiln.compile(module, backend="eager")
    x = torch.randn(2, 4)
    calls = []
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: calls.append(type(mod)))
    try:
        torch.testing.assert_close(compiled(x), module(x))
    finally:
        handle.remove()
    assert len(calls) == 2 * 3  # the root, the Linear and the Tanh, once per call


def test_training_with_root_hooks_matches_eager_gradients():
    torch.manual_seed(0)
    eager = _hook(_linear(), HOOKS["all"][:1] + HOOKS["forward"])
    torch.manual_seed(0)
    module = _hook(_linear(), HOOKS["all"][:1] + HOOKS["forward"])
    compiled = kiln.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    eager(x).sum().backward()
    compiled(x).sum().backward()
    for (name, e), (_, c) in zip(eager.named_parameters(), module.named_parameters()):
        torch.testing.assert_close(c.grad, e.grad, msg=name)

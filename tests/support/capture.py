"""Shared checks for the capture tests: compile with backend="eager", compare with eager.

`check(fn, *args)` runs `fn` eagerly and through `kiln.compile`, on clones of the
same inputs, and compares outputs (nested containers too), the inputs after the
call (in-place ops), and gradients when an input requires grad. It then calls
both again with fresh random inputs of the same shapes and dtypes, which must not
recompile. It returns the compile context so a test can assert graph counts.
"""
from __future__ import annotations

import copy

import torch

import kiln
from kiln.api import context_of


def fresh(value):
    """A new random value with the same structure, shapes, dtypes and requires_grad."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            new = torch.rand(value.shape) > 0.5
        elif value.dtype.is_floating_point or value.dtype.is_complex:
            new = torch.randn(value.shape, dtype=value.dtype)
        elif value.numel():  # within the original's range: an index stays a valid index
            new = torch.randint(int(value.min()), int(value.max()) + 1, value.shape, dtype=value.dtype)
        else:
            new = value.clone()
        return new.requires_grad_(value.requires_grad)
    if isinstance(value, list):
        return [fresh(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(fresh(v) for v in value)
    if isinstance(value, dict):
        return {k: fresh(v) for k, v in value.items()}
    return value


def clone(value):
    """A deep copy whose tensors are leaves with the same requires_grad (so grads can be compared)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, list):
        return [clone(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(clone(v) for v in value)
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    return value


def assert_same(expected, actual, atol=1e-5, rtol=1e-4, path="out"):
    """Structural equality: tensors by value/dtype/shape, containers item by item, the rest by ==."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual).__name__}"
        assert actual.shape == expected.shape, f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad differs"
        torch.testing.assert_close(actual.detach(), expected.detach(), atol=atol, rtol=rtol, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
        return
    assert type(actual) is type(expected), f"{path}: type {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, atol, rtol, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same(expected[k], actual[k], atol, rtol, f"{path}[{k!r}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def tensors_in(value):
    """The tensors inside `value` (nested lists, tuples and dicts), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def _loss(out):
    parts = [t.sum() for t in tensors_in(out) if t.requires_grad and t.dtype.is_floating_point]
    return sum(parts) if parts else None


def _run_and_compare(eager_fn, compiled_fn, args, kwargs, atol, module_pair=None):
    e_args, c_args = clone(args), clone(args)
    e_kwargs, c_kwargs = clone(kwargs), clone(kwargs)
    expected = eager_fn(*e_args, **e_kwargs)
    actual = compiled_fn(*c_args, **c_kwargs)
    assert_same(expected, actual, atol)
    assert_same(e_args, c_args, atol, path="args after the call")
    e_loss, c_loss = _loss(expected), _loss(actual)
    assert (e_loss is None) == (c_loss is None), "one of eager/compiled output requires grad and the other not"
    if e_loss is not None:
        e_loss.backward()
        c_loss.backward()
        for i, (e, c) in enumerate(zip(tensors_in(e_args), tensors_in(c_args))):
            if e.requires_grad:
                assert_same(e.grad, c.grad, atol, path=f"grad of input {i}")
        if module_pair is not None:
            for (name, e), (_, c) in zip(module_pair[0].named_parameters(), module_pair[1].named_parameters()):
                assert_same(e.grad, c.grad, atol, path=f"grad of {name}")
    return expected, actual


def check(fn, *args, graphs=None, records=None, fullgraph=False, atol=1e-5, kwargs=None, second=True, **compile_kwargs):
    """Compile `fn` (backend="eager"), compare with eager on `args` and on fresh args; returns the context.

    `graphs`: the number of captured graphs expected after both calls (records with a graph);
    `records`: the number of captures (a break adds a continuation's capture).
    """
    kwargs = kwargs or {}
    compiled = kiln.compile(fn, backend="eager", fullgraph=fullgraph, **compile_kwargs)
    _run_and_compare(fn, compiled, args, kwargs, atol)
    ctx = context_of(compiled)
    n_first = len(ctx.records)
    if second:
        _run_and_compare(fn, compiled, fresh(args), fresh(kwargs), atol)
        assert len(ctx.records) == n_first, f"a second call with fresh inputs recompiled: {recompile_reasons(ctx)}"
    if graphs is not None:
        assert graph_count(ctx) == graphs, f"expected {graphs} graphs, got {graph_count(ctx)}: {break_reasons(ctx)}"
    if records is not None:
        assert len(ctx.records) == records, f"expected {records} captures, got {len(ctx.records)}"
    return ctx


def check_module(make, *args, graphs=None, records=None, fullgraph=False, atol=1e-5, train=None, **compile_kwargs):
    """Like `check` for a module factory: eager and compiled run on two identical copies."""
    torch.manual_seed(0)
    eager_mod = make()
    compiled_mod = copy.deepcopy(eager_mod)
    if train is not None:
        eager_mod.train(train)
        compiled_mod.train(train)
    opt = kiln.compile(compiled_mod, backend="eager", fullgraph=fullgraph, **compile_kwargs)
    _run_and_compare(eager_mod, opt, args, {}, atol, (eager_mod, compiled_mod))
    ctx = context_of(opt)
    n_first = len(ctx.records)
    eager_mod.zero_grad()
    compiled_mod.zero_grad()
    _run_and_compare(eager_mod, opt, fresh(args), {}, atol, (eager_mod, compiled_mod))
    assert len(ctx.records) == n_first, f"a second call with fresh inputs recompiled: {recompile_reasons(ctx)}"
    if graphs is not None:
        assert graph_count(ctx) == graphs, f"expected {graphs} graphs, got {graph_count(ctx)}: {break_reasons(ctx)}"
    if records is not None:
        assert len(ctx.records) == records, f"expected {records} captures, got {len(ctx.records)}"
    return ctx


def graph_count(ctx) -> int:
    return sum(1 for r in ctx.records if r.graph is not None)


def break_reasons(ctx) -> list[str]:
    return [r.graph_break.reason.id for r in ctx.records if r.graph_break is not None]


def recompile_reasons(ctx) -> list[str]:
    return [r.recompile_reason for r in ctx.records if r.recompile_reason]


def t(*shape, grad=False, dtype=torch.float32):
    x = torch.randn(*shape, dtype=dtype)
    return x.requires_grad_(grad)


class CountingBackend:
    """A backend that counts the graphs handed to it and runs each as captured."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward

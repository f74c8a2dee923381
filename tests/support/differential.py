"""Running a program eagerly and compiled, and comparing everything a user can observe of the results.

`check(fn, make_args, backend)` calls `fn` on two identical sets of arguments (`make_args()` is called
once per side, so it must build the same values each time), then compares side by side:

- each output's value, shape, strides, dtype, `requires_grad`, `is_leaf` and whether it has a `grad_fn`;
- which outputs and inputs are the same object, and which share storage;
- after a backward from every output that requires grad (or those `loss_from` names), each input's `.grad`
  (None where eager's is);
- after writing into each output in place, every input and output again (a write through one
  alias is seen through the others, as in eager).
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

import kiln


def check(fn, make_args, backend: str, *, dynamic=None, calls: int = 1, compiled=None, loss_from=None,
          grad_mode: bool = True) -> None:
    """Compare eager and kiln on `calls` calls (each with fresh arguments from `make_args(call)`).

    `loss_from`: the tensor outputs (positions among them) the backward starts from; default all.
    `grad_mode`: whether the calls run with grad mode on."""
    compiled = compiled or kiln.compile(fn, backend=backend, dynamic=dynamic)
    for call in range(calls):
        eager_args, kiln_args = make_args(call), make_args(call)
        with torch.set_grad_enabled(grad_mode):
            expected, actual = fn(*eager_args), compiled(*kiln_args)
        where = f"{backend}, call {call}"
        compare_results(eager_args, expected, kiln_args, actual, where, loss_from)


def compare_results(eager_args, expected, kiln_args, actual, where: str, loss_from=None) -> None:
    e_in, k_in = _tensors(eager_args), _tensors(kiln_args)
    e_out, k_out = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    assert pytree.tree_structure(expected) == pytree.tree_structure(actual), where
    for k, (e, a) in enumerate(zip(e_out, k_out)):
        _compare_leaf(e, a, f"{where}, output {k}")
    assert _sharing(e_in + _tensors(e_out)) == _sharing(k_in + _tensors(k_out)), f"{where}: aliasing differs"
    e_roots, k_roots = _tensors(e_out), _tensors(k_out)
    if loss_from is not None:
        e_roots, k_roots = [e_roots[k] for k in loss_from], [k_roots[k] for k in loss_from]
    _compare_grads(e_in, e_roots, k_in, k_roots, where)
    _compare_writes(e_in, _tensors(e_out), k_in, _tensors(k_out), where)


def _tensors(values) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(values) if isinstance(v, torch.Tensor)]


def _compare_leaf(e, a, where: str) -> None:
    assert type(e) is type(a), f"{where}: {type(a).__name__} instead of {type(e).__name__}"
    if not isinstance(e, torch.Tensor):
        assert e == a, f"{where}: {a!r} instead of {e!r}"
        return
    assert (a.shape, a.dtype) == (e.shape, e.dtype), f"{where}: {a.shape} {a.dtype} instead of {e.shape} {e.dtype}"
    assert a.stride() == e.stride(), f"{where}: strides {a.stride()} instead of {e.stride()}"
    torch.testing.assert_close(a.detach(), e.detach(), equal_nan=True, msg=lambda m: f"{where}: {m}")
    autograd = lambda t: (t.requires_grad, t.is_leaf, t.grad_fn is None)  # noqa: E731
    assert autograd(a) == autograd(e), f"{where}: (requires_grad, is_leaf, no grad_fn) {autograd(a)} vs {autograd(e)}"


def _sharing(tensors: list[torch.Tensor]) -> list[tuple]:
    """For each pair: (same object, same storage)."""
    storage = [t.untyped_storage().data_ptr() if t.untyped_storage().nbytes() else None for t in tensors]
    return [(a is b, storage[i] is not None and storage[i] == storage[j])
            for i, a in enumerate(tensors) for j, b in enumerate(tensors) if i < j]


def _compare_grads(e_in, e_out, k_in, k_out, where: str) -> None:
    e_roots = [o for o in e_out if o.requires_grad]
    if not e_roots:
        return
    k_roots = [o for o in k_out if o.requires_grad]
    for roots in (e_roots, k_roots):
        torch.autograd.backward([o.float().sum() for o in roots], retain_graph=True)
    for k, (e, a) in enumerate(zip(e_in, k_in)):
        if not e.is_leaf:
            continue
        assert (a.grad is None) == (e.grad is None), f"{where}: input {k}'s .grad is {a.grad} instead of {e.grad}"
        if e.grad is not None:
            torch.testing.assert_close(a.grad, e.grad, msg=lambda m, k=k: f"{where}: grad of input {k}: {m}")


def _compare_writes(e_in, e_out, k_in, k_out, where: str) -> None:
    """Write into each floating output in place; what every alias then reads must match eager."""
    for k, (e, a) in enumerate(zip(e_out, k_out)):
        if not e.is_floating_point():
            continue
        with torch.no_grad():
            try:
                e.add_(10.0 * (k + 1))
            except RuntimeError:  # a view eager does not let be written (an output of unbind, say)
                continue
            a.add_(10.0 * (k + 1))
        for i, (x, y) in enumerate(zip(e_in + e_out, k_in + k_out)):
            torch.testing.assert_close(y.detach(), x.detach(), equal_nan=True,
                                       msg=lambda m, k=k, i=i: f"{where}: after writing output {k}, tensor {i}: {m}")

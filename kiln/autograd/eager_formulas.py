"""Backward formulas that eager picks by looking at tensor data or type, traced as eager's real tensors pick them.

Autograd's C++ formulas for a few ops choose between two expressions of the same derivative, and the choice
changes the answer at inf, NaN and zero elements:

- `prod` (whole tensor, or along a dim): with no zero in the input, eager computes `grad * (result / input)`;
  with zeros, the products of the other elements (exclusive cumulative products from both ends); with two zeros
  or more in the whole tensor (the full reduction, outside a double backward), zeros. At an inf element without
  zeros, `inf / inf` is NaN where the products of the others are finite; at a NaN element, every gradient of
  the row is NaN.
- `max()`, `min()`, `median()`, `nanmedian()` (the full reductions): on the CPU eager fills the gradient over
  zeros where the input equals the result (`masked_fill`); on CUDA it multiplies the mask by the gradient, so
  an inf or NaN gradient gives NaN at the other elements too.

Eager takes the data-dependent branch only for plain tensors: on a tensor subclass (a fake tensor, which is
what tracing runs) it takes the branch that needs no data (products of the others; the mask product). A traced
backward therefore differs from eager's wherever the branches disagree. While the joint graph is traced,
`eager_formulas()` routes these calls, where their input requires grad, through an autograd.Function whose
backward computes eager's formula for the device the graph runs on, both branches computed and one selected
per call with `torch.where` (no data read while tracing).
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def _prod_others(grad: torch.Tensor, inp: torch.Tensor, dim: int) -> torch.Tensor:
    """`grad` times the product of the other elements along `dim`: exclusive cumulative products from both ends
    (eager's `prod_safe_zeros_backward`), exact where the input holds zeros."""
    if inp.numel() == 0:
        return grad.expand_as(inp)
    n = inp.shape[dim]
    if n == 1:
        return grad
    ones = torch.ones((), dtype=inp.dtype, device=inp.device).expand(
        [1 if d == dim else s for d, s in enumerate(inp.shape)])
    before = torch.cat([ones, inp.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    after = torch.cat([ones, inp.narrow(dim, 1, n - 1).flip(dim)], dim).cumprod(dim).flip(dim)
    return grad * (before * after)


def prod_backward(grad: torch.Tensor, inp: torch.Tensor, result: torch.Tensor, dim: int | None,
                  keepdim: bool) -> torch.Tensor:
    """Eager's gradient of `prod(inp)` (`dim` None) or `prod(inp, dim, keepdim)` on real tensors."""
    if inp.dim() == 0:
        return grad
    zeros = (inp == 0).sum()
    if dim is None:
        others = _prod_others(grad, inp.contiguous().view(-1), 0).view_as(inp)
        if not torch.is_grad_enabled():  # eager's shortcut outside a double backward: every product holds a zero
            others = torch.where(zeros > 1, torch.zeros_like(others), others)
    else:
        dim = dim % inp.dim()
        if not keepdim:
            grad, result = grad.unsqueeze(dim), result.unsqueeze(dim)
        others = _prod_others(grad, inp, dim)
    # where the input holds a zero, the quotient is not eager's branch: divided by one there, not by the zero, so
    # that differentiating the where again (create_graph=True) gives its unselected side zeros, not 0 * nan
    no_zero = zeros == 0
    return torch.where(no_zero, grad * (result / torch.where(no_zero, inp, torch.ones_like(inp))), others)


def _prod(inp: torch.Tensor, dim: int | None, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    return torch.prod(inp, dtype=dtype) if dim is None else torch.prod(inp, dim, keepdim, dtype=dtype)


class EagerProd(torch.autograd.Function):
    """`prod` with eager's backward formula (`prod_backward`). The backward computes the product again from the
    input rather than reading the forward's: the partition still computes it once (in the forward, or in the
    backward from the saved input), and a backward that reads only the input differentiates again under
    autograd (create_graph=True, runtime.py `_differentiable_saves`). The result is saved all the same, as
    eager's node saves it: unpacking it checks its version, so a result written in place before the backward
    raises eager's error (tests/autograd/test_saved_value_overwritten.py)."""

    @staticmethod
    def forward(ctx, inp, dim, keepdim, dtype):
        result = _prod(inp, dim, keepdim, dtype)
        ctx.save_for_backward(inp, result)
        ctx.dim, ctx.keepdim = dim, keepdim
        return result

    @staticmethod
    def backward(ctx, grad):
        inp, _ = ctx.saved_tensors
        # eager's formula reads the input in the gradient's dtype (`prod(x, dtype=torch.float64)`)
        same = inp.to(grad.dtype)
        g = prod_backward(grad, same, _prod(same, ctx.dim, ctx.keepdim, None), ctx.dim, ctx.keepdim)
        return g.to(inp.dtype), None, None, None


class EagerEvenlyDistributed(torch.autograd.Function):
    """A full reduction that picks elements (`max()`, `min()`, `median()`, `nanmedian()`) with eager's CPU
    backward: the gradient shared among the elements equal to the result (NaN ones where it is NaN), zeros
    elsewhere, whatever the gradient."""

    @staticmethod
    def forward(ctx, inp, reduce):
        result = reduce(inp)
        ctx.save_for_backward(inp, result)
        return result

    @staticmethod
    def backward(ctx, grad):
        inp, result = ctx.saved_tensors
        mask = torch.where(result.isnan(), inp.isnan(), inp == result)
        return torch.where(mask, grad / mask.sum(), torch.zeros((), dtype=grad.dtype, device=grad.device)), None


_PROD = (torch.prod, torch.Tensor.prod)
_PICKING = {torch.max: torch.max, torch.Tensor.max: torch.max, torch.min: torch.min, torch.Tensor.min: torch.min,
            torch.median: torch.median, torch.Tensor.median: torch.median,
            torch.nanmedian: torch.nanmedian, torch.Tensor.nanmedian: torch.nanmedian}


def _differentiable_real(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and t.dtype.is_floating_point and torch.is_grad_enabled()


def _prod_call(args: tuple, kwargs: dict):
    """`EagerProd`'s arguments for a call of `prod`, or None for a call this module leaves to autograd."""
    kwargs = dict(kwargs)
    inp, rest = args[0], list(args[1:])
    dim = rest.pop(0) if rest else kwargs.pop("dim", None)
    keepdim = rest.pop(0) if rest else kwargs.pop("keepdim", False)
    dtype = kwargs.pop("dtype", None)
    if rest or kwargs or not _differentiable_real(inp) or (dtype is not None and not dtype.is_floating_point):
        return None
    return inp, dim, keepdim, dtype


class _EagerFormulas(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PROD:
            call = _prod_call(args, kwargs)
            if call is not None:
                return EagerProd.apply(*call)
        elif func in _PICKING and len(args) == 1 and not kwargs and _differentiable_real(args[0]) \
                and args[0].device.type != "cuda":
            return EagerEvenlyDistributed.apply(args[0], _PICKING[func])
        return func(*args, **kwargs)


def eager_formulas() -> TorchFunctionMode:
    """The mode under which the joint graph's forward runs (joint.py): the calls above take eager's formulas."""
    return _EagerFormulas()

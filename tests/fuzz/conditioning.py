"""Is eager's own answer stable where kiln differs? Programs whose value depends on eager's kernels.

Some values are not a property of the program but of the kernel that computed them: `gelu(inf)` is
nan on eager's vectorized CPU path and inf on its scalar path; `argmax` over sums that tie but for
one ulp picks whichever the summation order favours. kiln differing from eager there is no bug.

The test of that is eager against itself: the same program, called with the same input values laid
out differently (non-contiguous, column-major) or in float64, runs other kernels and summation orders.
Where kiln differs from eager, every differing position must be one where some such eager run
differs from eager too, and kiln's value must be one eager gave there (for floats: within the range
eager's runs span). Then the program is "ill-conditioned" at those positions, a status of its own,
with the reason printed; otherwise the difference stays "wrong".
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from tests.fuzz.compare import close_mask, leaves, storage_of


def _dense_strides(shape, order, gap: int) -> list[int]:
    """Strides of a dense layout that walks the dims in `order` (innermost first), `gap` apart."""
    strides, step = [0] * len(shape), gap
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return strides


def _relaid(t: torch.Tensor, gap: int) -> torch.Tensor:
    """`t`'s values in a column-major layout with `gap`-element holes: a leaf with t's requires_grad."""
    if t.dim() == 0:
        return t.detach().clone().requires_grad_(t.requires_grad)
    out = torch.empty_strided(t.shape, _dense_strides(t.shape, range(t.dim()), gap), dtype=t.dtype, device=t.device)
    with torch.no_grad():
        out.copy_(t)
    return out.requires_grad_(t.requires_grad)


def _float64(t: torch.Tensor) -> torch.Tensor:
    if not t.dtype.is_floating_point:
        return t
    return t.detach().double().requires_grad_(t.requires_grad)


# how an input is changed for each of eager's re-runs: the same values, other kernels
VARIANTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "column-major inputs": lambda t: _relaid(t, 1),
    "non-contiguous inputs": lambda t: _relaid(t, 2),
    "float64 inputs": _float64,
}


MAKERS = ("randn", "ints", "bools")
"""The input makers of `runtime` a program's `inputs` may call. Inputs that share storage (`d = b[::2]`) are
changed where they are made: the makers' tensors are, and the views the program derives from them follow."""


def eager_rerun(load: Callable[[], dict], call: int, change: Callable, call_once: Callable):
    """The result of eager's call `call` of a fresh copy of the program (earlier calls replayed, for the Python
    state they leave), its tensor inputs changed by `change`; None when it raised."""
    ns = load()
    with torch.random.fork_rng(devices=[]):
        for earlier in range(call):
            call_once(ns, ns["f"], earlier)
        made = ns["inputs"]
        args = made(call)
        if _shares_storage(args):  # relaid copies of each would not alias as the program's inputs do
            for name in MAKERS:
                ns[name] = _changed(ns[name], change)
        else:
            ns["inputs"] = lambda c: [change(a) if isinstance(a, torch.Tensor) else a for a in args]
        _, result, error = call_once(ns, ns["f"], call)
    return None if error is not None else result


def _shares_storage(args: list) -> bool:
    storages = [storage_of(a) for a in args if isinstance(a, torch.Tensor) and storage_of(a) is not None]
    return len(set(storages)) != len(storages)


def _changed(maker: Callable, change: Callable) -> Callable:
    def make(*args, **kwargs):
        return change(maker(*args, **kwargs))
    return make


def unstable_positions(e_res, k_res, reruns: dict) -> str | None:
    """Why kiln's differences from eager are eager's own instability, or None when one is not.

    `reruns`: variant name -> eager's result under it (None: it raised). Each output tensor where kiln
    differs must differ only where a re-run of eager differs, and hold a value eager's runs span there.
    """
    e_leaves, k_leaves = leaves(e_res), leaves(k_res)
    if len(e_leaves) != len(k_leaves):
        return None
    reasons = []
    for i, (e, k) in enumerate(zip(e_leaves, k_leaves)):
        if e.shape != k.shape:
            return None
        differs = ~close_mask(e, k)
        if not differs.any():
            continue
        runs = {name: _leaf(r, i, e) for name, r in reruns.items()}
        runs = {name: v for name, v in runs.items() if v is not None}
        unstable = {name: ~close_mask(e, v) for name, v in runs.items()}
        if not runs or (differs & ~_any(unstable.values(), differs)).any():
            return None
        if not _within_eagers_span(e, k, list(runs.values()), differs):
            return None
        where = differs.nonzero()[0].tolist()
        names = [name for name, mask in unstable.items() if mask[tuple(where)]]
        reasons.append(f"output {i} at {where}: kiln {_at(k, where)}, eager {_at(e, where)}, and eager itself "
                       f"{', '.join(f'{_at(runs[n], where)} with {n}' for n in names)}")
    return "; ".join(reasons) or None


def _leaf(result, i: int, like: torch.Tensor) -> torch.Tensor | None:
    found = leaves(result) if result is not None else []
    if len(found) <= i or found[i].shape != like.shape:
        return None
    return found[i].detach().to(like.dtype)


def _any(masks, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like, dtype=torch.bool)
    for m in masks:
        out |= m
    return out


def _within_eagers_span(e: torch.Tensor, k: torch.Tensor, runs: list[torch.Tensor], where: torch.Tensor) -> bool:
    """At `where`, kiln's value is one eager gave (NaN and inf included), or between eager's smallest and largest."""
    values = [e.detach()] + runs
    matches = _any([close_mask(v, k) for v in values], where)
    if k.dtype.is_floating_point:
        stacked = torch.stack([v.double() for v in values])
        k64 = k.detach().double()
        with contextlib.suppress(RuntimeError):
            matches |= (stacked.amin(0) <= k64) & (k64 <= stacked.amax(0))
    return bool(matches[where].all())


def _at(t: torch.Tensor, where: list) -> str:
    return repr(t.detach()[tuple(where)].item())

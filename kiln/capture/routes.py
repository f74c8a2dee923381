"""Calls that another kiln compiler owns: capture ends the graph before them on purpose (a boundary, not a
graph break: allowed under fullgraph=True, not counted) and the output program hands them to that
compiler instead of running them eagerly.

A deferred route is not a boundary: its call is replayed after the graph, like a log call. Compilers
above capture register here (`kiln.optim` registers `optimizer.step()`), so capture needs no
import of them. A route matches the function being called (a bound method's function, unwrapped).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Route:
    reason_id: str  # a boundary reason of the break catalogue
    matches: Callable[[Any], bool]  # the called function (bound methods unwrapped to their function)
    run: Callable[..., Any]  # run(ctx, fn, *args, **kwargs): the call, made by the route's compiler
    # recorded and made after the graph instead of ending it: for calls that only reset Python state no
    # graph op reads (optimizer.zero_grad()); capture refuses a later read of what they reset
    deferred: bool = False


_routes: list[Route] = []


def register(route: Route) -> None:
    _routes.append(route)


def find(fn: Any) -> Route | None:
    """The route that owns a call of `fn`, if any."""
    target = getattr(fn, "__func__", fn)
    for route in _routes:
        if route.matches(target):
            return route
    return None

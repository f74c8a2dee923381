"""Context managers as Dynamo's test_ctx_manager exercises them: grad modes (entered inside and outside the
compiled code, nested, as decorators), autocast, user-defined and contextlib managers, and graph breaks inside
a `with` block, whose outputs must keep eager's requires_grad."""
import contextlib

import pytest
import torch

from .reference import Table, check, globals_state, t

torch.manual_seed(0)
cases = Table()
A = t(4)
G = t(4, grad=True)
M = t(3, 4, grad=True)
EVENTS = []


class Recorder:
    """A user-defined context manager with side effects on entry and exit."""

    def __init__(self, tag):
        self.tag = tag

    def __enter__(self):
        EVENTS.append(("enter", self.tag))
        return self

    def __exit__(self, *exc):
        EVENTS.append(("exit", self.tag))
        return False


@contextlib.contextmanager
def recording(tag):
    EVENTS.append(("open", tag))
    try:
        yield tag * 2
    finally:
        EVENTS.append(("close", tag))


class Suppressor:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is ValueError


@cases((G,))
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + x


@cases((G,))
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x * 3
    return y, z


@cases((G,))
def set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x.sin()
    return y, x.cos()


@cases((G,))
def set_grad_enabled_as_call(x):
    prev = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    y = x * 2
    torch.set_grad_enabled(prev)
    return y, x * 3


@cases((G,))
def no_grad_decorator_on_inner(x):
    @torch.no_grad()
    def helper(v):
        return v * 4
    return helper(x) + x


@cases((G,))
def inference_mode_block(x):
    with torch.inference_mode():
        y = x + 1
    return y * 2


@cases((G,))
def grad_mode_query_inside(x):
    with torch.no_grad():
        flag = torch.is_grad_enabled()
    return x * (2 if flag else 3)


@cases((G,))
def detach_inside_enable_grad(x):
    with torch.enable_grad():
        return x.detach() * 2, x * 2


@cases((G,))
def no_grad_with_break_inside(x):
    with torch.no_grad():
        y = x * 2
        _ = y.sum().item()
        z = y + 1
    return z, x * 3


@cases((G,))
def enable_grad_with_break_inside(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
            print(end="")
            z = y + 1
    return z


@cases((G,))
def set_grad_enabled_with_break(x):
    with torch.set_grad_enabled(False):
        a = x + 1
        if a.sum() > 1e9:
            a = a * 0
        b = a * 2
    return b, x + 2


@cases((G,))
def nested_no_grad_levels(x):
    with torch.no_grad():
        with torch.no_grad():
            a = x * 2
        b = x * 3
    c = x * 4
    return a, b, c


@cases((G,))
def grad_mode_restored_after_exception(x):
    try:
        with torch.no_grad():
            raise KeyError("inside")
    except KeyError:
        pass
    return x * 2


@cases((A,))
def autocast_cpu_bfloat16(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x.view(2, 2) @ x.view(2, 2)
    return y, y.dtype


@cases((A,))
def autocast_disabled_region(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            y = x.view(2, 2) @ x.view(2, 2)
        z = x.view(2, 2) @ x.view(2, 2)
    return y, z


@cases((A,), state=globals_state(globals(), EVENTS=[]))
def user_context_manager(x):
    with Recorder("a") as r:
        y = x * len(r.tag)
    return y


@cases((A,), state=globals_state(globals(), EVENTS=[]))
def nested_user_context_managers(x):
    with Recorder("outer"), Recorder("inner"):
        y = x + 1
    return y


@cases((A,), state=globals_state(globals(), EVENTS=[]))
def contextlib_manager(x):
    with recording(3) as v:
        y = x * v
    return y


@cases((A,), state=globals_state(globals(), EVENTS=[]))
def user_context_with_break(x):
    with Recorder("b"):
        y = x + 1
        _ = y.sum().item()
        y = y * 2
    return y


@cases((A,), state=globals_state(globals(), EVENTS=[]))
def context_exit_on_exception(x):
    try:
        with Recorder("c"):
            raise RuntimeError("boom")
    except RuntimeError:
        x = x + 1
    return x


@cases((A,))
def suppressing_context(x):
    with Suppressor():
        x = x + 1
        raise ValueError("swallowed")
    return x * 2


@cases((A,))
def contextlib_nullcontext(x):
    with contextlib.nullcontext(5) as v:
        return x * v


@cases((A,))
def contextlib_suppress(x):
    with contextlib.suppress(IndexError):
        x = x + [1][3]
    return x - 1


@cases((A,), state=globals_state(globals(), EVENTS=[]))
def exit_stack(x):
    with contextlib.ExitStack() as stack:
        stack.enter_context(Recorder("s1"))
        stack.enter_context(Recorder("s2"))
        y = x * 2
    return y


@cases((A,))
def manual_seed_inside(x):
    torch.manual_seed(3)
    return x + torch.rand(4)


@cases((A,))
def fork_rng_region(x):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        r = torch.randn(4)
    return x + r


@cases((G,))
def no_grad_in_helper_then_grad(x):
    def frozen(v):
        with torch.no_grad():
            return v * 10
    return frozen(x) + x * x


@cases((G,))
def returns_inside_no_grad(x):
    with torch.no_grad():
        return x * 2


@cases((M,))
def set_grad_enabled_from_argument_false(m):
    with torch.set_grad_enabled(m.shape[0] > 5):
        return m.sum(0)


@cases((G,))
def requires_grad_toggled_inside(x):
    y = x.detach()
    y.requires_grad_(True)
    return y * 2, x * 2


@cases((A,))
def default_dtype_context(x):
    return torch.ones(2, dtype=torch.get_default_dtype()) + x[:2]


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_context_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)


def test_outer_no_grad_is_seen_by_compiled_code():
    """Grad mode set by the caller is a guard: the same function compiled under and outside no_grad."""
    def body(x):
        return x * 2
    with torch.no_grad():
        check(body, (G,))
    check(body, (G,))

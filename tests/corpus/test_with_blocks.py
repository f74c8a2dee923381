"""`with` blocks kiln captures whole, as torch.compile does: autocast, inference mode, contextlib's managers,
exceptions leaving a block (suppressed or not), and graph breaks inside a block, after which the continuation
resumes inside it. Each case must match eager and capture at most torch.compile's graph count, and never run
its frame eagerly (a count of 0)."""
import contextlib

import pytest
import torch

from .reference import Table, check, globals_state, t

torch.manual_seed(0)
cases = Table()
A = t(4)
G = t(4, grad=True)
S = t(4, 4)
SG = t(4, 4, grad=True)
EVENTS = []


@contextlib.contextmanager
def catching(kind):
    """Swallows `kind` raised inside its block (through the generator's `throw`)."""
    try:
        yield 2
    except kind:
        EVENTS.append("caught")
    finally:
        EVENTS.append("closed")


class Swallow:
    """A user manager whose `__exit__` suppresses ValueError only."""

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        return typ is ValueError


# --- a graph break inside a block: the continuation resumes inside it ---------------------------

@cases((S,))
def break_inside_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
        torch._dynamo.graph_break()
        z = y @ y
    return z, z @ z


@cases((SG,), atol=5e-2, rtol=5e-2)  # bfloat16 gradients: torch.compile's differ from eager's as much
def break_inside_autocast_training(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = (x @ x).relu()
        torch._dynamo.graph_break()
        z = (y @ x).float()
    return z.sum()


@cases((S,))
def break_inside_autocast_inside_no_grad(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            y = x @ x
            torch._dynamo.graph_break()
            z = y @ y
        w = z @ z
    return w, w @ w, torch.is_grad_enabled()


@cases((S,))
def two_breaks_inside_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
        torch._dynamo.graph_break()
        y = y @ x
        torch._dynamo.graph_break()
        y = y @ x
    return y, y @ y


@cases((S,), (t(4, 4, dtype=torch.float64),))
def break_inside_autocast_of_argument_dtype(x):
    with torch.autocast("cpu", dtype=torch.bfloat16 if x.dtype == torch.float32 else torch.float16):
        y = x.float() @ x.float()
        torch._dynamo.graph_break()
        z = y @ y
    return z


@cases((G,))
def break_inside_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
        torch._dynamo.graph_break()
        z = y + 1
    return z * 3, torch.is_grad_enabled()


@cases((G,))
def break_in_enable_grad_inside_inference_mode(x):
    with torch.inference_mode():
        y = x * 2
        with torch.enable_grad():
            torch._dynamo.graph_break()
            z = y + 1
            inner = torch.is_grad_enabled()
        w = z * 2
    return w, inner, torch.is_grad_enabled(), x * 3


@cases((G,))
def break_in_inference_mode_inside_no_grad(x):
    with torch.no_grad():
        with torch.inference_mode():
            y = x * 2
            torch._dynamo.graph_break()
            z = y + 1
        w = z * x
    return w, torch.is_grad_enabled(), x * 3


@cases((G,))
def branch_on_tensor_inside_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x.view(2, 2) @ x.view(2, 2)
        if y.sum() > 0:
            y = y @ y
    return y


# --- inference mode -------------------------------------------------------------------------------

@cases((G,))
def inference_mode_query(x):
    with torch.inference_mode():
        inside = torch.is_inference_mode_enabled()
        y = x * 2
    return y + 1, inside, torch.is_inference_mode_enabled(), x * 3


@cases((G,))
def inference_mode_false_is_a_no_op(x):
    with torch.inference_mode(False):
        y = x * 2
    return y


# --- exceptions leaving a block --------------------------------------------------------------------

@cases((A,), state=globals_state(globals(), EVENTS=[]))
def contextmanager_swallows_through_throw(x):
    with catching(KeyError) as k:
        x = x * k
        raise KeyError("k")
    return x + 1


@cases((A,))
def user_exit_suppresses_by_type(x):
    with Swallow():
        x = x + 1
        raise ValueError("v")
    return x * 2


@cases((A,))
def suppress_an_exception_raised_inside(x):
    with contextlib.suppress(KeyError), contextlib.suppress(IndexError):
        x = x + 1
        [][1]
    return x - 1


@cases((A,))
def exception_through_no_grad_caught_outside(x):
    try:
        with torch.no_grad():
            raise KeyError("x")
    except KeyError:
        y = x * 3
    return y, torch.is_grad_enabled()


@cases((S,))
def exception_through_autocast_caught_outside(x):
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            raise KeyError("x")
    except KeyError:
        y = x @ x
    return y


@cases((A,), state=globals_state(globals(), EVENTS=[]))
def exit_stack_of_contextmanagers(x):
    with contextlib.ExitStack() as stack:
        k = stack.enter_context(catching(KeyError))
        y = x * k
    return y


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_with_block_case_matches_eager_and_torch_count(fn, calls, options):
    counts = check(fn, *calls, **options)  # asserts kiln's count <= torch.compile's
    assert counts.kiln > 0, f"kiln ran the frame eagerly where torch.compile captured {counts.torch} graphs"

"""Grad-mode and autocast contexts inside the compiled region: no_grad, enable_grad,
set_grad_enabled (as a context and as a call), autocast; the state is restored after."""
import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import check, t


def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y + x, y.requires_grad


def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
    return a, b, a.requires_grad, b.requires_grad


def set_grad_enabled_ctx(x, mode):
    with torch.set_grad_enabled(mode):
        y = x.sin()
    return y, torch.is_grad_enabled()


def set_grad_enabled_call(x):
    torch.set_grad_enabled(False)
    y = x * 2
    torch.set_grad_enabled(True)
    return y + x


def is_grad_enabled_branch(x):
    if torch.is_grad_enabled():
        return x * 2
    return x * 3


def nested_no_grad_return_inside(x):
    with torch.no_grad():
        return x * 5


def autocast_cpu(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
    return y, y.dtype, (y.float() + 1).dtype


def autocast_disabled(x, w):
    with torch.autocast("cpu", enabled=False):
        return x @ w


def inference_mode_query(x):
    return x * (2 if torch.is_inference_mode_enabled() else 3)


CASES = [
    (no_grad_block, (t(3, grad=True),)),
    (enable_grad_inside_no_grad, (t(3, grad=True),)),
    (set_grad_enabled_ctx, (t(3, grad=True), False)),
    (set_grad_enabled_ctx, (t(3, grad=True), True)),
    (set_grad_enabled_call, (t(3, grad=True),)),
    (is_grad_enabled_branch, (t(3, grad=True),)),
    (nested_no_grad_return_inside, (t(3, grad=True),)),
    (autocast_cpu, (t(4, 4), t(4, 4))),
    (autocast_disabled, (t(4, 4), t(4, 4))),
    (inference_mode_query, (t(3),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_context_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True, atol=1e-2)
    assert torch.is_grad_enabled()


def test_called_under_no_grad():
    def fn(x):
        return x * 2, torch.is_grad_enabled()

    c = kiln.compile(fn, backend="eager")
    x = t(3, grad=True)
    with torch.no_grad():
        out, flag = c(x)
    assert flag is False and not out.requires_grad
    out, flag = c(x)
    assert flag is True and out.requires_grad
    assert len(context_of(c).records) == 2


def test_grad_mode_restored_when_compiled_code_raises():
    def fn(x):
        with torch.no_grad():
            y = x * 2
        if y.shape[0] == 3:
            raise RuntimeError("boom")
        return y

    c = kiln.compile(fn, backend="eager")
    with pytest.raises(RuntimeError, match="boom"):
        c(t(3, grad=True))
    assert torch.is_grad_enabled()


def test_no_grad_decorator_function_inlined():
    @torch.no_grad()
    def helper(x):
        return x * 2

    def fn(x):
        return helper(x) + x

    check(fn, t(3, grad=True))


def test_autocast_called_from_outside():
    def fn(x, w):
        return x @ w

    c = kiln.compile(fn, backend="eager")
    x, w = t(4, 4), t(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = c(x, w)
        ref = fn(x, w)
    assert out.dtype == ref.dtype == torch.bfloat16
    out2 = c(x, w)
    assert out2.dtype == torch.float32
    assert len(context_of(c).records) == 2


def _autocast_break_inside(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        print("inside")
        z = y @ w
    return z, y.dtype


def _autocast_break_before(x, w):
    y = x * 2
    print("before")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = y @ w
        print("inside")
    return z.float() @ w


def _unknown_context_break_before(x):
    import contextlib

    y = x * 2
    print("before")
    with contextlib.nullcontext():
        y = y + 1
        print("inside")
    return y


@pytest.mark.parametrize("fn,args", [
    (_autocast_break_inside, lambda: (t(4, 4), t(4, 4))),
    (_autocast_break_before, lambda: (t(4, 4), t(4, 4))),
    (_unknown_context_break_before, lambda: (t(3),)),
], ids=["autocast_break_inside", "autocast_break_before", "unknown_context_break_before"])
def test_break_and_unresumable_with_block_runs_correctly(fn, args, capsys):
    """A continuation cannot rebuild an autocast or unknown `with` block: the frame runs natively."""
    c = kiln.compile(fn, backend="eager")
    for _ in range(2):
        a = args()
        out, ref = c(*a), fn(*a)
        if isinstance(out, tuple):
            out, ref = out[0], ref[0]
        torch.testing.assert_close(out.float(), ref.float())
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")


def test_inference_mode_change_recompiles():
    def fn(x):
        return x * (2 if torch.is_inference_mode_enabled() else 3)

    c = kiln.compile(fn, backend="eager")
    x = t(2)
    with torch.no_grad():
        torch.testing.assert_close(c(x), x * 3)
    with torch.inference_mode():
        torch.testing.assert_close(c(x), x * 2)
    assert len(context_of(c).records) == 2


class _Depth:
    """A context manager written in Python: kiln inlines its __enter__ and __exit__."""

    def __init__(self):
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return 2.0

    def __exit__(self, *exc_info):
        self.depth -= 1
        return False


def test_python_context_managers_are_inlined_into_one_graph():
    import contextlib

    outer = _Depth()

    def f(x):
        with contextlib.nullcontext():
            y = x * 2
        with outer as k:
            y = y * k
        with _Depth() as k2:
            y = y + k2
        return y

    c = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(c(x), f(x))
    torch.testing.assert_close(c(torch.ones(3)), f(torch.ones(3)))
    assert outer.depth == 0
    assert len(kiln.api.context_of(c).records) == 1


def test_break_inside_a_python_context_manager_runs_the_frame_natively_and_correctly():
    outer = _Depth()

    def g(x):
        with outer as k:
            y = x * k
            kiln.graph_break()
            y = y + 1
        return y, outer.depth

    c = kiln.compile(g, backend="eager")
    x = torch.randn(3)
    out, depth = c(x)
    torch.testing.assert_close(out, x * 2 + 1)
    assert depth == 0 and outer.depth == 0


def write_after_block(x):
    with torch.inference_mode():
        y = x * 2
    y.add_(1)
    return y


def write_after_block_with_break(x):
    with torch.inference_mode():
        kiln.graph_break()
        y = x.sum()
    y.zero_()
    return y


def write_view_made_in_block(x):
    base = x * 2
    with torch.inference_mode():
        view = base[0]
    view.mul_(3)
    return base


def save_for_backward_after_block(x, w):
    with torch.inference_mode():
        y = x + 1
    return w * y


def version_read_after_block(x):
    with torch.inference_mode():
        y = x + 1
    return y * y._version


def requires_grad_after_block(x):
    with torch.inference_mode():
        y = x + 1
    return y.requires_grad_()


@pytest.mark.parametrize("fn,args", [
    (write_after_block, (t(3),)),
    (write_after_block_with_break, (t(3),)),
    (write_view_made_in_block, (t(2, 3, grad=True),)),
    (save_for_backward_after_block, (t(3), t(3, grad=True))),
    (version_read_after_block, (t(3),)),
    (requires_grad_after_block, (t(3),)),
], ids=["inplace", "inplace_after_break", "view_inplace", "saved_for_backward", "version", "requires_grad_"])
def test_inference_tensor_used_outside_its_block_raises_what_eager_raises(fn, args):
    with pytest.raises(RuntimeError) as expected:
        fn(*args)
    for backend in ("eager", "aot_eager"):
        kiln.fallbacks.reset()
        with pytest.raises(RuntimeError) as got:
            kiln.compile(fn, backend=backend)(*args)
        assert str(got.value) == str(expected.value)
        # the frame runs natively from the use eager raises at: a break, not a fallback (a failed capture would be
        # one, and an error of its own under strict mode)
        assert kiln.fallbacks.breaks["exception"] == 1 and kiln.fallbacks.records() == []


def test_inference_tensor_uses_eager_allows_stay_in_one_graph():
    def fn(x, w):
        with torch.inference_mode():
            y = x * 2
            y.add_(1)  # inside the block: allowed
        return y + x, (w * 2) * y.sum()  # read outside it, and not saved for backward: allowed

    check(fn, t(3), t(3, grad=True), graphs=1, fullgraph=True)

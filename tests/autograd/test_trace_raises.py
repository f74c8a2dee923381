"""Programs whose ops fail their checks on the traced sizes, dtypes or strides: eager raises at run time (in
the forward, or in the backward once the forward ran), and tracing the graph meets the same error at compile
time (fake kernels check internal overlap under dynamic shapes; tracing the backward runs autograd's checks).
kiln must not fail the compile, but raise eager's error where eager raises it. Eager and kiln side by side.
"""
import pytest
import torch

import kiln


def write_into_expanded_slice(d):
    t = d.unsqueeze(-1).expand(*d.shape, 3)
    t[:-1] = 0
    return d * 2


def add_into_expanded(d):
    t = d.unsqueeze(0).expand(2, *d.shape)
    t.add_(1)
    return t


def copy_into_expanded(d):
    t = d[:1].expand(*d.shape)
    t.copy_(d * 3)
    return t


FORWARD_RAISES = [write_into_expanded_slice, add_into_expanded, copy_into_expanded]


def zero_expanded_after_softmax(a):
    t = (a * 2).unsqueeze(0).expand(2, *a.shape)
    torch.softmax(t, 0)
    t.zero_()
    return t


def fill_expanded_row(a):
    t = (a + 1).unsqueeze(0).expand(3, *a.shape)
    t.fill_(2.0)
    return t * a


BACKWARD_RAISES = [zero_expanded_after_softmax, fill_expanded_row]


def outcome(fn, make, backward: bool):
    """(outputs, error of the forward, error of the backward), errors as (type, message)."""
    args = make()
    try:
        out = fn(*args)
    except RuntimeError as e:
        return None, (type(e), str(e)), None
    if backward:
        try:
            out.sum().backward()
        except RuntimeError as e:
            return out.detach(), None, (type(e), str(e))
    return out.detach(), None, None


@pytest.mark.sampled(every=2, classes=("program", "dynamic"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("program", FORWARD_RAISES, ids=lambda f: f.__name__)
def test_forward_raises_as_eager(program, dynamic, backend):
    compiled = kiln.compile(program, backend=backend, dynamic=dynamic)
    for n in (3, 5):
        def make(n=n):
            return [torch.linspace(-1.0, 1.0, n)]
        with torch.no_grad():
            expected, actual = outcome(program, make, False), outcome(compiled, make, False)
        assert expected[1] is not None and actual == expected


@pytest.mark.sampled(every=2, classes=("program", "dynamic"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("program", BACKWARD_RAISES, ids=lambda f: f.__name__)
def test_backward_raises_as_eager(program, dynamic, backend):
    """The forward returns eager's values; the backward raises eager's error."""
    compiled = kiln.compile(program, backend=backend, dynamic=dynamic)
    for n in (3, 5):
        def make(n=n):
            return [torch.linspace(-1.0, 1.0, 2 * n).reshape(n, 2).requires_grad_()]
        (e_out, e_fwd, e_bwd), (k_out, k_fwd, k_bwd) = outcome(program, make, True), outcome(compiled, make, True)
        assert e_fwd is None and k_fwd is None
        torch.testing.assert_close(k_out, e_out)
        assert e_bwd is not None and k_bwd == e_bwd


def test_a_tracing_that_runs_out_of_stack_is_kiln_s_failure(monkeypatch):
    """RecursionError is a RuntimeError, but no op's check of eager's: it is kiln's tracing looping (two
    decomposition tables taking an op to each other). It fails the compile, loudly, rather than running the graph
    op by op as if eager raised there too, which hid the loop behind right answers."""
    from kiln.autograd import aot
    from kiln.capture.entry import BackendCompilerFailed

    def loops(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(aot, "trace_joint", loops)
    compiled = kiln.compile(lambda x: x.sin() * 2, backend="aot_eager")
    with pytest.raises(BackendCompilerFailed, match="RecursionError"):
        compiled(torch.randn(3, requires_grad=True))

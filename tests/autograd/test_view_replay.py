"""The view ops of an output, recorded on fake tensors and replayed on real ones (kiln/autograd/view_replay.py)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kiln.autograd.view_replay import ViewRecorder, replay


def _recorded(make_view, shape=(4, 6)):
    """(fake base, fake view, the recorder) of `make_view` run on a fake tensor of `shape`."""
    mode, views = FakeTensorMode(), ViewRecorder()
    with mode:
        base = torch.empty(shape)
    with mode, views:
        view = make_view(base)
    return base, view, views


VIEWS = {
    "slice_then_transpose": lambda t: t[1:].t(),
    "select_then_unsqueeze": lambda t: t[2].unsqueeze(0),
    "view_then_diagonal": lambda t: t.view(6, 4).diagonal(),
    "narrow_then_expand": lambda t: t.narrow(1, 2, 1).expand(4, 5),
    "unbind_item": lambda t: t.unbind(1)[3],
    "dtype_view": lambda t: t[1:3].view(torch.int32),
}


@pytest.mark.parametrize("name", VIEWS)
def test_replay_gives_eagers_view(name):
    base, view, views = _recorded(VIEWS[name])
    steps = views.chain(view, base)
    real = torch.linspace(-1.0, 1.0, 24).reshape(4, 6).clone().requires_grad_()
    expected, actual = VIEWS[name](real), replay(real, steps)
    assert (actual.shape, actual.stride(), actual.storage_offset()) == \
        (expected.shape, expected.stride(), expected.storage_offset())
    assert (actual._base is real) == (expected._base is real) and type(actual.grad_fn) is type(expected.grad_fn)
    torch.testing.assert_close(actual, expected)


def test_steps_are_plain_data():
    """Lists among the arguments are tuples: the compile cache keeps the steps as they are (aot_cache.py)."""
    base, view, views = _recorded(lambda t: t.view(6, 4)[1:])
    steps = views.chain(view, base)
    assert [s.op for s in steps] == ["aten.view.default", "aten.slice.Tensor"]
    assert steps[0].args == ((6, 4),) and hash(steps)


def test_no_chain_to_a_tensor_it_does_not_view():
    base, view, views = _recorded(lambda t: (t * 2)[1:])
    assert views.chain(view, base) is None
    assert views.depth(view) == 1 and views.ancestors(view)[0] is view._base

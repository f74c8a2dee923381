"""Value checks of eager's kernels that tracing drops, beside eager (capture/values/polyfills.py `one_hot`).

`F.one_hot` checks its class values in eager; fake tensors skip the check and the traced graph compares with an
arange, so a class out of range gave a row of zeros where eager raises. kiln adds the check to the graph: a value
out of range makes the graph raise, and the frame's eager re-run raises eager's exception. Values in range run
compiled (KILN_STRICT=1: no fallback), used or unused, with static and dynamic sizes, on every backend.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

PROGRAMS = {
    "used": lambda i: F.one_hot(i, 3) * 2,
    "unused": lambda i: (F.one_hot(i, 3), i + 1)[1],
    "summed_as_float": lambda i: F.one_hot(i, 4).float().sum(0),
}
CALLS = [torch.tensor([0, 2, 1]), torch.tensor([-1, 2, 1, 0]), torch.tensor([0, 4, 1, 1, 2]), torch.tensor([1, 1])]


def _outcome(fn, i):
    try:
        return fn(i)
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        return type(e), str(e)


@pytest.mark.sampled(every=3, classes=("name", "dynamic"))
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_hot_of_a_class_out_of_range_raises_as_eager_does(name, dynamic, backend):
    fn = PROGRAMS[name]
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    for i in CALLS:
        expected, got = _outcome(fn, i), _outcome(compiled, i)
        if isinstance(expected, tuple):
            assert got == expected
        else:
            torch.testing.assert_close(got, expected)


def test_the_check_stays_in_the_graph():
    """One graph, no break: the check is an op of the graph, not a Python branch on a value."""
    compiled = kiln.compile(PROGRAMS["used"], fullgraph=True)
    torch.testing.assert_close(compiled(CALLS[0]), PROGRAMS["used"](CALLS[0]))
    assert _outcome(compiled, CALLS[1]) == _outcome(PROGRAMS["used"], CALLS[1])

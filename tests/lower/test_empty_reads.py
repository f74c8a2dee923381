"""Kernels never load from a buffer of no element.

Any address in an empty buffer is outside it, so where a kernel's expression still reads one, the program
discards the value: a `where` the lowering folded to False, the gradient of an empty slice scattered into
zeros. The load itself read past the buffer (often a null pointer): a segfault on the CPU, an illegal address
on the GPU (fuzz seed 450200, the gradient of `a[:0]`, found through the Triton target on the CPU). The
lowering reads such a buffer as 0 (kiln/lower/ir.py `without_empty_reads`). Each case runs strict through kiln's
C++ target and, under the interpreter, its Triton target, forward and backward, against eager.
"""
import pytest
import torch

import kiln
from support.triton_device import DEVICE

CASES = {
    "the gradient of an empty slice": lambda a: a[:0] * 2.0 + torch.ones(2),
    "an empty slice's gradient beside a used part": lambda a: (a[:0] + 1.0, a[1:] * 3.0),
    "an empty narrow of a computed value": lambda a: (a.exp()[a.shape[0]:] + 1.0, a.sin()),
    "the gradient of an empty index into a row": lambda a: a[:, :0].sum(-1) + a[:, 0],
}

TARGETS = ["cpp"] + (["triton"] if DEVICE == "cpu" else [])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(CASES))
def test_a_program_reading_an_empty_part_matches_eager_forward_and_backward(name, target):
    fn = CASES[name]
    a = torch.randn(3, 2, requires_grad=True)
    want = fn(a)
    want_outputs = want if isinstance(want, tuple) else (want,)
    sum(o.sum() for o in want_outputs).backward()
    want_grad, a.grad = a.grad, None
    got = kiln.compile(fn, options={"cpu_backend": target})(a)
    got_outputs = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got_outputs, want_outputs):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)
    sum(o.sum() for o in got_outputs).backward()
    torch.testing.assert_close(a.grad, want_grad)

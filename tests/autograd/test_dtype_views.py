"""Outputs that view a tensor's storage as another dtype (`view(dtype)`, `view_as_complex`, `view_as_real`).

The graph returns no data for an output that views an input (the runtime rebuilds it on the input's
storage); a rebuild that kept the input's dtype returned float32 where eager returns complex64 or int32.
Each case compares kiln with eager: values, dtype, shape, strides, shared storage and gradients.
"""
from __future__ import annotations

import pytest
import torch

import kiln

CASES = {
    "view_as_complex": lambda x: torch.view_as_complex(x),
    "view_as_complex_of_slice": lambda x: torch.view_as_complex(x[1:, ::2]),
    "view_as_real_roundtrip": lambda x: torch.view_as_real(torch.view_as_complex(x))[:, 1:],
    "view_int32": lambda x: x.view(torch.int32),
    "view_complex64": lambda x: x.view(torch.complex64)[1],
    "view_float64_narrower": lambda x: x.view(torch.float64)[1:],
    "view_int16_wider": lambda x: x[1:].view(torch.int16),
    "input_and_two_views": lambda x: (x, x.view(torch.int32)[2], torch.view_as_complex(x)),
    "views_of_an_output": lambda x: (lambda y: (y, y.view(torch.int32), torch.view_as_complex(y)))(x * 2),
}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values as bytes: a float view of integer bits may hold NaNs, which no value comparison matches."""
    return t.contiguous().view(torch.uint8)


def _same(got, ref):
    got, ref = (got if isinstance(got, tuple) else (got,)), (ref if isinstance(ref, tuple) else (ref,))
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert (g.dtype, g.shape, g.stride(), g.storage_offset()) == (r.dtype, r.shape, r.stride(), r.storage_offset())
        assert torch.equal(_bytes(g.detach()), _bytes(r.detach()))


@pytest.mark.parametrize("name", CASES)
def test_dtype_view_outputs_match_eager(name):
    fn = CASES[name]
    x = torch.randn(6, 4, 2)
    ref_x, got_x = x.clone(), x.clone()
    ref, got = fn(ref_x), kiln.compile(fn, dynamic=False)(got_x)
    _same(got, ref)
    for g in (got if isinstance(got, tuple) else (got,)):  # views of the input share its storage, as eager's do
        if name != "views_of_an_output":
            assert g.untyped_storage().data_ptr() == got_x.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", ["view_as_complex", "view_as_complex_of_slice", "view_as_real_roundtrip"])
def test_complex_views_of_inputs_that_require_grad_keep_their_history(name):
    fn = CASES[name]
    x = torch.randn(6, 4, 2)
    ref_x, got_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, got = fn(ref_x), kiln.compile(fn, dynamic=False)(got_x)
    _same(got, ref)
    ref.abs().sum().backward()
    got.abs().sum().backward()
    torch.testing.assert_close(got_x.grad, ref_x.grad)


def test_writes_through_a_dtype_view_reach_the_input():
    fn = CASES["view_int32"]
    x = torch.randn(4, 2)
    got_x = x.clone()
    kiln.compile(fn, dynamic=False)(got_x).fill_(0)
    assert torch.equal(got_x, torch.zeros(4, 2))


CONJUGATE_VIEWS = {  # outputs whose conjugate bit differs from their base's: a strided rebuild dropped it
    "ihfft": lambda x: torch.fft.ihfft(x),
    "conj_of_an_output": lambda x: torch.fft.fft(x).conj(),
    "conj_of_a_slice": lambda x: (torch.fft.fft(x), torch.fft.fft(x)[1:].conj()),
    "conj_of_an_input_view": lambda x: torch.view_as_complex(x.view(4, 2)).conj(),
}


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", CONJUGATE_VIEWS)
def test_conjugate_view_outputs_match_eager(name, requires_grad):
    fn = CONJUGATE_VIEWS[name]
    x = torch.randn(8)
    ref_x, got_x = x.clone().requires_grad_(requires_grad), x.clone().requires_grad_(requires_grad)
    ref, got = fn(ref_x), kiln.compile(fn, dynamic=False)(got_x)
    ref, got = (ref if isinstance(ref, tuple) else (ref,)), (got if isinstance(got, tuple) else (got,))
    for g, r in zip(got, ref):
        assert g.is_conj() == r.is_conj()
        torch.testing.assert_close(g.resolve_conj(), r.resolve_conj())
    if requires_grad:
        cotangents = [torch.randn(r.shape, dtype=r.dtype, generator=torch.Generator().manual_seed(1)) for r in ref]
        torch.testing.assert_close(torch.autograd.grad(got, got_x, cotangents)[0],
                                   torch.autograd.grad(ref, ref_x, cotangents)[0])

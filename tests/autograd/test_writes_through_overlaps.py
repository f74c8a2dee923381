"""A write into a view taken through a view whose elements share memory, of a tensor the graph made.

kiln turns such a write into a write of one `as_strided` view of the tensor that owns the memory
(kiln/autograd/functionalize.py, `_writes_through_overlaps`). Where the chain reinterprets the dtype on the way
(`.view(torch.int16)` of a bf16 tensor, then `unsqueeze(-1).expand(...)`), the owner is of the other dtype: the
direct view is viewed back as the written dtype, so the written value keeps its bits (a fill of 2 into the int16
view wrote bf16's 2.0, 16384; fuzz seed 406073). A view of smaller elements (`.real` of a complex tensor, bytes of
a float one) counts its geometry in its own elements: the owner's are read as several of them and the one at the
offset selected (fuzz seed 401913 raised at its first run). Eager and kiln side by side: values and aliasing.
"""
import pytest
import torch

from support.differential import check


def fill_an_expanded_bit_view(b):
    t0 = (b.to(torch.bfloat16) * 2).view(torch.int16)
    t2 = t0.unsqueeze(-1).expand(*t0.shape, 3)
    t2[..., 1:].fill_(2)
    return t0, t2


def fill_an_expanded_view(b):
    t0 = b * 2
    t2 = t0.unsqueeze(-1).expand(*t0.shape, 3)
    t2[..., 1:].fill_(2)
    return t0, b + 1


def fill_an_expanded_real_part(b):
    t0 = (b.to(torch.complex64) * 2).real
    t2 = t0.unsqueeze(-1).expand(*t0.shape, 3)
    t2[..., 1:].fill_(2)
    return t0, t2


def fill_an_expanded_imaginary_part(b):
    z = b.to(torch.complex64) * 2
    t2 = z.imag.unsqueeze(-1).expand(*z.shape, 3)
    t2[..., 1:].fill_(2)
    return z, t2


def fill_expanded_bytes(b):
    t0 = b * 2
    t1 = t0.view(torch.int8)[..., ::4]  # the lowest byte of each float
    t2 = t1.unsqueeze(-1).expand(*t1.shape, 3)
    t2[..., 1:].fill_(7)
    return t0, t2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [fill_an_expanded_bit_view, fill_an_expanded_view, fill_an_expanded_real_part,
                                     fill_an_expanded_imaginary_part, fill_expanded_bytes], ids=lambda f: f.__name__)
def test_a_write_through_an_overlapping_view_writes_the_views_value(program, backend):
    check(program, lambda call: [torch.randn(3, 4, generator=torch.Generator().manual_seed(call))], backend, calls=2)

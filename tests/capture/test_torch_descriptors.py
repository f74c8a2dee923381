"""torch's descriptor objects (memory formats, layouts, dtypes, devices) are constants of the graph, wherever
they come from: a `torch.` attribute in the function, a global, an argument. Memory formats and layouts were
opaque objects, so `x.float(memory_format=...)` or `empty_like(x, layout=...)` broke the graph."""
from __future__ import annotations

import pytest
import torch

import kiln
from support.capture import check, graph_count, t

CHANNELS_LAST = torch.channels_last


def cast_keeping_channels_last(x):
    return x.float(memory_format=torch.channels_last) * 2


def contiguous_in_a_global_format(x):
    y = x.contiguous(memory_format=CHANNELS_LAST)
    return y + 1, y.stride()


def like_with_a_layout(x):
    return torch.zeros_like(x, layout=torch.strided) + x, torch.empty_like(x, layout=torch.strided).shape


def clone_preserving_format(x):
    return x.clone(memory_format=torch.preserve_format).relu()


def format_argument(x, fmt):
    return x.to(memory_format=fmt).sin()


@pytest.mark.parametrize("fn", [cast_keeping_channels_last, contiguous_in_a_global_format, like_with_a_layout,
                                clone_preserving_format])
def test_descriptor_constants_stay_in_the_graph(fn):
    ctx = check(fn, t(2, 3, 4, 5, dtype=torch.float64), fullgraph=True)
    assert graph_count(ctx) == 1


def test_a_memory_format_argument_is_guarded_by_value():
    compiled = kiln.compile(format_argument, fullgraph=True)
    x = torch.randn(2, 3, 4, 5)
    for fmt in (torch.channels_last, torch.contiguous_format, torch.channels_last):
        got, want = compiled(x, fmt), format_argument(x, fmt)
        assert got.stride() == want.stride(), fmt
        torch.testing.assert_close(got, want)


def test_results_keep_eager_strides():
    x = torch.randn(2, 3, 4, 5)
    got = kiln.compile(cast_keeping_channels_last, fullgraph=True)(x)
    assert got.stride() == cast_keeping_channels_last(x).stride()

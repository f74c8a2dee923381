"""A row's max or min on the C++ target runs in tiles of 16 lanes, each with its own accumulator, merged in order
at the end (kiln/codegen/cpp/kernel.py `_lane_tiles`): kiln's max keeps eager's NaN through a helper the vectorizer
does not take as a reduction, so the row's loop did not vectorize (a 4096x1024 row max took 10.7 ms, now 0.9 ms).
Every lane, the elements past the last whole tile, a NaN anywhere, integers, and a sum or a store beside the max."""
import pytest
import torch

import kiln


def row_max(x):
    return x.amax(-1)


def row_min(x):
    return x.amin(-1)


def max_and_sum(x):
    return x.amax(-1) + x.sum(-1)


def softmax(x):
    return torch.softmax(x, -1)


def max_of_squares_and_the_squares(x):
    return (x * x).amax(-1), x * x


def two_tiled_segments(x):
    """A max in each of two segments of one kernel's row: each tiled loop in a scope of its own (their bounds share
    one name; a redeclaration failed the kernel's build, test_cache_processes found it)."""
    return (x.exp() * 2).softmax(-1) + x.amax(-1, keepdim=True)


@pytest.mark.parametrize("width", [1, 17, 1000])
@pytest.mark.parametrize("fn", [row_max, row_min, max_and_sum, softmax, max_of_squares_and_the_squares,
                                two_tiled_segments],
                         ids=lambda f: f.__name__)
def test_a_row_reduction_in_lane_tiles_gives_eagers_values(fn, width):
    x = torch.randn(6, width, generator=torch.Generator().manual_seed(width))
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


@pytest.mark.parametrize("position", [0, 5, 16, 31, 32])
def test_a_nan_in_any_lane_or_in_the_rest_is_the_rows_max_and_min(position):
    x = torch.randn(3, 33)
    x[1, position] = float("nan")
    x[2] = float("-inf")
    for fn in (row_max, row_min):
        got, want = kiln.compile(fn)(x), fn(x)
        torch.testing.assert_close(got, want, equal_nan=True)
        assert got[1].isnan()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bfloat16])
def test_integer_and_half_rows(dtype):
    x = torch.randint(0, 100, (5, 37), generator=torch.Generator().manual_seed(1)).to(dtype)
    for fn in (row_max, row_min):
        torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


@pytest.mark.parametrize("size", [40_000, 4096 * 3 + 7])
@pytest.mark.parametrize("position", ["first", "tile", "rest"])
def test_a_full_max_in_lane_tiles_per_block_keeps_a_nan_anywhere(size, position):
    """A full reduction's threads share blocks of 4096 elements and run each in lane tiles: a NaN in a tile or in
    a block's last, partial tile is the max and the min."""
    x = torch.randn(size, generator=torch.Generator().manual_seed(size))
    functions = (lambda t: t.amax(), lambda t: t.amin(), lambda t: t.max())
    for fn in functions:
        torch.testing.assert_close(kiln.compile(fn)(x), fn(x))
    x[{"first": 0, "tile": 4096 + 17, "rest": size - 1}[position]] = float("nan")
    for fn in functions:
        assert kiln.compile(fn)(x).isnan()

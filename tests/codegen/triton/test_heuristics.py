"""The launch rules for reductions (kiln/codegen/triton/heuristics.py), read off the configurations they choose.

A training step's reductions come in two shapes: along contiguous rows (layer norm and its backward over a
transformer's width) and along a strided dim (a column sum: bias gradients, layer norm's weight and bias
gradients, batch norm's statistics over NHWC). Each rule is checked over a spread of sizes, the odd ones
included; the kernels these configurations produce are run against eager in test_reduction_tiles.py.
"""
from __future__ import annotations

import pytest

from kiln.codegen.triton.heuristics import (
    COLUMN_MAX_RSPLIT,
    COLUMN_MIN_CHUNK_TILES,
    COLUMN_PERSISTENT_MAX_RNUMEL,
    COLUMN_SPLIT_PROGRAMS,
    COLUMN_XBLOCK,
    WARP_ROW_ELEMENTS,
    column_reduction,
    row_reduction,
)

# (columns, rows): DeiT-small's and BERT-base's widths over their token counts, a ConvNeXt-like NHWC batch,
# ResNet-50's stem batch norm over NHWC (64 channels, batch 64 at 112x112), and odd sizes
COLUMN_SHAPES = [(384, 12608), (1536, 12608), (768, 4096), (3072, 4096), (96, 200704), (300, 1100), (24, 9000),
                 (5000, 700), (3, 1300), (64, 802816)]


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


@pytest.mark.parametrize("columns, rows", COLUMN_SHAPES)
def test_a_column_sum_reads_coalesced_tiles_and_splits_its_rows_to_fill_the_gpu(columns, rows):
    cfg = column_reduction(columns, rows, "tl.int32")
    assert cfg.XBLOCK == min(COLUMN_XBLOCK, 1 << (columns - 1).bit_length())  # columns along the contiguous dim
    assert cfg.RBLOCK >= 8 and cfg.XBLOCK * cfg.RBLOCK <= 4096
    programs = _ceil_div(columns, cfg.XBLOCK)
    if cfg.kind == "looped":  # no split: the columns fill the GPU, or the rows are too few to share
        assert programs >= COLUMN_SPLIT_PROGRAMS // 2 or rows < 2 * COLUMN_MIN_CHUNK_TILES * cfg.RBLOCK, cfg
        return
    assert cfg.kind == "split", cfg
    assert cfg.RCHUNK % cfg.RBLOCK == 0 and cfg.RCHUNK >= COLUMN_MIN_CHUNK_TILES * cfg.RBLOCK
    assert (cfg.RSPLIT - 1) * cfg.RCHUNK < rows <= cfg.RSPLIT * cfg.RCHUNK  # every chunk has rows
    assert cfg.RSPLIT <= COLUMN_MAX_RSPLIT
    # as many programs as the rows allow, up to about the target
    assert programs * cfg.RSPLIT >= min(COLUMN_SPLIT_PROGRAMS // 2, programs * COLUMN_MAX_RSPLIT // 2,
                                        programs * rows // (2 * COLUMN_MIN_CHUNK_TILES * cfg.RBLOCK)), cfg


def test_short_columns_fit_one_block_and_long_ones_loop():
    assert column_reduction(4096, COLUMN_PERSISTENT_MAX_RNUMEL, "tl.int32").kind == "persistent"
    assert column_reduction(4096, COLUMN_PERSISTENT_MAX_RNUMEL + 1, "tl.int32").kind in ("looped", "split")
    # columns a later segment reads back (a softmax over them) stay in one block up to PERSISTENT_MAX_RBLOCK
    assert column_reduction(4096, 1000, "tl.int32", reads_back=True).kind == "persistent"
    longer = column_reduction(4096, 1025, "tl.int32", reads_back=True)  # looped, never split, narrow tiles
    assert (longer.kind, longer.XBLOCK) == ("looped", 16), longer
    # symbolic sizes: a looped tile, never a split (its chunks need static rows)
    assert column_reduction(None, None, "tl.int32").kind == "looped"
    assert column_reduction(384, None, "tl.int32").kind == "looped"


@pytest.mark.parametrize("width", [256, 300, 384, 512, 768, 1000, 1024])
def test_rows_of_a_transformers_width_reduce_in_one_warp(width):
    """Layer norm (forward and backward) over 256 to 1024 values: one warp per program, XBLOCK rows of
    WARP_ROW_ELEMENTS lanes, when there are rows enough to fill the GPU with such programs."""
    cfg = row_reduction(12608, width, "tl.int32")
    rblock = 1 << (width - 1).bit_length()
    assert (cfg.kind, cfg.num_warps, cfg.RBLOCK, cfg.XBLOCK) == ("persistent", 1, rblock, WARP_ROW_ELEMENTS // rblock)
    few = row_reduction(64, width, "tl.int32")  # few rows: wider programs, more warps each
    assert few.kind == "persistent" and few.num_warps > 1


@pytest.mark.parametrize("width", [19, 128, 197])
def test_short_rows_keep_wide_persistent_blocks(width):
    cfg = row_reduction(12608, width, "tl.int32")
    assert cfg.kind == "persistent" and cfg.XBLOCK > 1 and cfg.XBLOCK * cfg.RBLOCK <= 4096


def test_few_long_rows_split_and_every_chunk_has_rows():
    for rows, width in [(3, 9000), (1, 4841472), (256, 128 * 128 * 2)]:
        cfg = row_reduction(rows, width, "tl.int32")
        assert cfg.kind == "split", cfg
        assert (cfg.RSPLIT - 1) * cfg.RCHUNK < width <= cfg.RSPLIT * cfg.RCHUNK, cfg

"""Block sizes and `num_warps` for one kernel, from its sizes alone (mode="default").

Four shapes of kernel:
  pointwise   1-D blocks of XBLOCK elements over the flattened output;
  tiled       a transposing pointwise kernel: 2-d tiles, RBLOCK along the dim its loads walk and
              XBLOCK along the others (`transposed_dim`);
  persistent  a reduction whose whole row fits one block (RBLOCK >= rnumel): every
              row is loaded once, and the values stay in registers for the epilogue
              segments (softmax, layernorm read their input once);
  looped      a reduction walks its rows in RBLOCK chunks, each lane accumulating,
              then combines the lanes.
  split       a looped reduction whose rows are cut into RSPLIT chunks run by separate
              programs, then combined by a second, small kernel (split.py).
A row-contiguous reduction (the reduced dim has stride 1) spends the block on the
reduction. A column reduction (stride 1 on an outer dim: a bias gradient, layer norm's
weight gradient, batch norm's statistics over NHWC) reads 2-d tiles, XBLOCK columns
coalesced by RBLOCK rows, and splits its rows across programs when its columns alone
give too few (`column_reduction`). max-autotune benchmarks around these choices
(`candidates`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from kiln.lower import ir
from kiln.lower.index import expanded_coeff, product, unit_step
from kiln.schedule.fusion import KernelGroup
from kiln.schedule.memory import storage_numel

PERSISTENT_MAX_RBLOCK = 1024   # past this a row is looped over (register pressure)
BLOCK_ELEMENTS = 4096          # XBLOCK * RBLOCK budget of one program
POINTWISE_XBLOCK = 1024
INT32_MAX = 2**31 - 1
MIN_PROGRAMS = 256
# A reduction over long rows (BatchNorm's statistics: N*H*W values per channel, contiguous in NCHW, a
# column reduction in channels-last) splits until it has this many programs, several per SM: each program
# keeps one block of loads in flight, and a few hundred channels at one program each left the GPU's memory
# bandwidth mostly idle. Rows shorter than ROW_SPLIT_MIN_RNUMEL do not: the second launch and the workspace
# cost more than they save (benchmarks/batchnorm_kernels.py times both on BatchNorm's shapes, in both layouts).
ROW_SPLIT_PROGRAMS = 1024
ROW_SPLIT_MIN_RNUMEL = 32768
MAX_RSPLIT = 256
# A row of 256 to 1024 values (layer norm over a transformer's width, its backward) reduces inside one warp:
# XBLOCK rows of WARP_ROW_ELEMENTS values per one-warp program, so the row sums need no shared memory and no
# barrier between warps, and many small programs keep loads in flight. Only with enough rows to fill the
# GPU with such programs (Inductor's persistent-reduction rule for CUDA makes the same choice).
WARP_ROW_MIN_RBLOCK = 256
WARP_ROW_ELEMENTS = 1024
WARP_ROW_MIN_XNUMEL = 1024
# Column reductions: a tile is COLUMN_XBLOCK columns (128 bytes of bf16 per row, coalesced) by up to
# COLUMN_TILE // COLUMN_XBLOCK rows. Columns of at most COLUMN_PERSISTENT_MAX_RNUMEL values fit one block (as
# Inductor keeps its outer reductions persistent up to 64), and so do columns up to PERSISTENT_MAX_RBLOCK that
# the kernel reads back (`reads_back`); longer ones loop, and split their rows into
# chunks of at least COLUMN_MIN_CHUNK_TILES tiles until COLUMN_SPLIT_PROGRAMS programs share the work (a few
# hundred columns at 64 per program are a handful of programs, each walking every row). Up to
# COLUMN_MAX_RSPLIT chunks: 64 channels of a batch norm over NHWC are one column tile, and MAX_RSPLIT chunks
# of it left most SMs with one program of four warps, too few loads in flight to near the memory's bandwidth.
COLUMN_XBLOCK = 64
MIN_COLUMN_XBLOCK = 16
COLUMN_TILE = 2048
COLUMN_PERSISTENT_MAX_RNUMEL = 64
COLUMN_SPLIT_PROGRAMS = 1024
COLUMN_MAX_RSPLIT = 1024
COLUMN_MIN_CHUNK_TILES = 2
COMBINE_ELEMENTS = 4096        # partials one program of a split's combining kernel reads
# max-autotune's other column shapes: (tile width, tile elements, programs a split aims for)
COLUMN_CANDIDATES = ((32, 2048, 1024), (128, 4096, 1024), (64, 1024, 1024), (64, 4096, 1024), (64, 2048, 512),
                     (64, 2048, 2048))
TILE = 16                      # the smallest last dim worth a 2-d tile
MIN_TILE_ROWS = 8              # the smallest dim a tile's rows may walk (a 3x3 weight's 9 taps)


@dataclass(frozen=True)
class LaunchConfig:
    """How one Triton kernel is launched: its shape of program (`kind`), block sizes and warps."""

    kind: str             # "pointwise" | "tiled" | "persistent" | "looped" | "split"
    XBLOCK: int
    RBLOCK: int = 1
    num_warps: int = 4
    index_dtype: str = "tl.int32"
    RSPLIT: int = 1       # split reductions: chunks of the reduction run by separate programs
    RCHUNK: int = 0       # elements of one chunk (a multiple of RBLOCK)
    COMBINE_XBLOCK: int = 1  # rows per program of the kernel combining the chunks


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _ceil_div(n: int, d: int) -> int:
    """n / d rounded up, in integers (exact for any size, unlike math.ceil over a float)."""
    return -(-n // d)


def _static(expr):
    expr = sympy.sympify(expr)
    return int(expr) if expr.is_Integer else None


def _index_dtype(group: KernelGroup, layouts: dict) -> str:
    """int32 when every buffer the kernel touches is statically smaller than 2**31 elements."""
    names = {n.name for n in group.nodes}
    for n in group.nodes:
        names |= {ld.buf for ld in ir.loads(n.data.body)}
    for b in names:
        if b in layouts:
            size = _static(storage_numel(layouts[b]))
            if size is None or size > INT32_MAX:
                return "tl.int64"
    total = _static(product(group.outer) * product(group.inner))
    return "tl.int32" if total is not None and total <= INT32_MAX else "tl.int64"


def reduction_is_contiguous(group: KernelGroup) -> bool:
    """True when the kernel's memory traffic runs along the innermost reduction dim (a row reduction), False when
    it runs along the last outer dim (a column reduction, read in tiles of columns).

    Each access of the reduction loop votes by its stride where the loops start (`unit_step`, which sees the
    innermost run of an index that wraps, as a window's rows do): a load from memory, and a store of a value
    computed per element (a transposing concatenation stored beside its column sum: Swin's q, k and v gradients
    stored as one matrix whose bias gradient sums them, where k's transposed load alone had made one program per
    column store with the width's stride). Rows win ties; with no stride-1 row access it is a column reduction.
    A value the same segment computes is read from registers, whatever the layout it is stored in: only loads
    from memory count (batch norm's masked gradient, stored by rows while its NHWC inputs are read by columns).
    Of the loads, those that vary with the outer loops decide when there are any: a vector indexed by the reduced
    dims alone (RMSNorm's per-row statistic in its weight gradient) is one value per row for every column, read
    once per tile row whatever its layout."""
    if not group.inner:
        return True
    variables = (*group.outer_vars(), *group.inner_vars())
    last, column = group.inner_vars()[-1], group.outer_vars()[-1] if group.outer else None
    outer = set(group.outer_vars())
    per_element, per_row = set(), set()  # (buffer, index): a load repeated in the body is one access
    for seg in group.segments:
        if not seg.inner:
            continue
        computed = {n.name for n in seg.nodes}
        for n in seg.nodes:
            for ld in ir.loads(group.mapped_body(n)):
                symbols = ir.index_symbols(ld)
                if ld.buf not in computed and last in symbols:
                    (per_element if symbols & outer else per_row).add((ld.buf, ld.index))
            stored = None if n.name in group.local or isinstance(n.data, ir.Reduction) else group.store_index(n)
            if stored is not None and last in stored.free_symbols:
                per_element.add((n.name, stored))
    accesses = [index for _, index in per_element or per_row]
    along_rows = [unit_step(index, last, variables) == 1 for index in accesses]
    rows = sum(along_rows)
    columns = 0 if column is None else sum(not row and unit_step(index, column, variables) == 1
                                           for row, index in zip(along_rows, accesses))
    return not accesses or (rows > 0 and rows >= columns)


def transposed_dim(group: KernelGroup):
    """For a pointwise kernel that transposes (a load walks memory along loop dim t, not the last one,
    while the stores walk the last dim): t, else None. Such a kernel runs on 2-d tiles (kind "tiled"):
    reads coalesced along t, writes along the last dim, Triton swapping them through shared memory."""
    if group.inner or len(group.outer) < 2 or any(_static(s) is None for s in group.outer) \
            or _static(group.outer[-1]) < TILE:
        return None
    variables = group.outer_vars()
    last = variables[-1]
    if any(expanded_coeff(group.store_index(n), last) != 1 for n in group.nodes if n.name not in group.local):
        return None
    for n in group.nodes:
        for ld in ir.loads(group.mapped_body(n)):
            if ld.indirect or expanded_coeff(ld.index, last) in (0, 1):
                continue
            for t, v in enumerate(variables[:-1]):
                if expanded_coeff(ld.index, v) == 1 and _static(group.outer[t]) >= MIN_TILE_ROWS:
                    return t
    return None


def choose(group: KernelGroup, layouts: dict) -> LaunchConfig:
    index_dtype = _index_dtype(group, layouts)
    xnumel = _static(product(group.outer))
    if not group.inner:
        t = transposed_dim(group)
        if t is not None:  # rows cover a short transposed dim whole, and the tile stays BLOCK_ELEMENTS
            rows = min(64, next_pow2(_static(group.outer[t])))
            return LaunchConfig("tiled", BLOCK_ELEMENTS // rows if rows < 64 else 64, rows, 4, index_dtype)
        xblock = POINTWISE_XBLOCK if xnumel is None else min(POINTWISE_XBLOCK, next_pow2(xnumel))
        return LaunchConfig("pointwise", xblock, 1, max(1, min(8, xblock // 256)), index_dtype)
    rnumel = _static(product(group.inner))
    if reduction_is_contiguous(group):
        return row_reduction(xnumel, rnumel, index_dtype)
    return column_reduction(xnumel, rnumel, index_dtype, reads_back=reads_back(group))


def reads_back(group: KernelGroup) -> bool:
    """Whether a later inner segment walks the reduced dims again (a softmax or a layer norm over them, which
    reads the reduction's result back): a looped kernel then reads its inputs once per such segment, a
    persistent one once."""
    return any(s.inner for s in group.segments[1:])


def row_reduction(xnumel: int | None, rnumel: int | None, index_dtype: str) -> LaunchConfig:
    """A reduction along contiguous rows: the block spans the row; a row that fits one block is persistent
    (one warp per program for rows of WARP_ROW_MIN_RBLOCK or more), a longer one loops, and few long rows split."""
    xcap = 1 << 30 if xnumel is None else next_pow2(xnumel)
    if rnumel is not None and next_pow2(rnumel) <= PERSISTENT_MAX_RBLOCK:
        rblock = next_pow2(rnumel)
        if rblock >= WARP_ROW_MIN_RBLOCK and xnumel is not None and xnumel >= WARP_ROW_MIN_XNUMEL:
            return LaunchConfig("persistent", min(xcap, WARP_ROW_ELEMENTS // rblock), rblock, 1, index_dtype)
        xblock = max(1, min(xcap, BLOCK_ELEMENTS // rblock, 64))
        return LaunchConfig("persistent", xblock, rblock, max(1, min(8, xblock * rblock // 512)), index_dtype)
    # enough programs to fill the GPU (a couple per SM) before widening blocks
    per_program = 1 if xnumel is None else max(1, _pow2_floor(xnumel // MIN_PROGRAMS))
    xblock = 1 if xcap <= 1 or rnumel is None or rnumel >= 4096 else min(xcap, 8, per_program)
    rblock = 2048 if xblock == 1 else 512
    looped = LaunchConfig("looped", xblock, rblock, max(1, min(8, xblock * rblock // 256)), index_dtype)
    if xnumel is None or rnumel is None:
        return looped
    programs = _ceil_div(xnumel, xblock)
    wanted = ROW_SPLIT_PROGRAMS if xblock == 1 and rnumel >= ROW_SPLIT_MIN_RNUMEL else MIN_PROGRAMS
    if programs >= wanted // 2:
        return looped
    return split(looped, xnumel, rnumel,
                 min(_pow2_floor(_ceil_div(wanted, programs)), _pow2_floor(rnumel // (2 * rblock)), MAX_RSPLIT))


def column_reduction(xnumel: int | None, rnumel: int | None, index_dtype: str, width: int | None = None,
                     tile: int | None = None, programs: int | None = None, reads_back: bool = False) -> LaunchConfig:
    """A reduction over a strided (outer) dim: tiles of `width` (COLUMN_XBLOCK) contiguous columns by up to
    `tile` // `width` rows (COLUMN_TILE), the rows split across programs until about `programs`
    (COLUMN_SPLIT_PROGRAMS) programs run (see the constants; max-autotune tries other values). A group that
    `reads_back` its columns (see `reads_back`) keeps them in one block up to PERSISTENT_MAX_RBLOCK rows: it
    cannot split, and a loop would read its inputs once per segment."""
    xcap = 1 << 30 if xnumel is None else next_pow2(xnumel)
    fits = rnumel is not None and next_pow2(rnumel) <= PERSISTENT_MAX_RBLOCK
    if rnumel is not None and (rnumel <= COLUMN_PERSISTENT_MAX_RNUMEL or (reads_back and fits)):
        rblock = next_pow2(rnumel)
        xblock = max(1, min(xcap, BLOCK_ELEMENTS // rblock, 128))
        return LaunchConfig("persistent", xblock, rblock, max(1, min(8, xblock * rblock // 512)), index_dtype)
    xblock = min(xcap, width or COLUMN_XBLOCK)
    rblock = max(8, (tile or COLUMN_TILE) // xblock)
    if rnumel is not None:
        rblock = min(rblock, next_pow2(rnumel))
    looped = LaunchConfig("looped", xblock, rblock, max(1, min(8, xblock * rblock // 512)), index_dtype)
    if xnumel is None or rnumel is None or reads_back:
        return narrowed(looped) if reads_back else looped
    wanted = _ceil_div(programs or COLUMN_SPLIT_PROGRAMS, _ceil_div(xnumel, xblock))
    return split(looped, xnumel, rnumel,
                 min(wanted, rnumel // (COLUMN_MIN_CHUNK_TILES * rblock), COLUMN_MAX_RSPLIT))


def unsplit(group: KernelGroup, config: LaunchConfig) -> LaunchConfig:
    """The looped form of a split `config`, for a group whose reduction cannot be split (a later inner segment
    reads its result back): a column tile narrowed (`narrowed`)."""
    looped = replace(config, kind="looped", RSPLIT=1, RCHUNK=0, COMBINE_XBLOCK=1)
    return looped if reduction_is_contiguous(group) else narrowed(looped)


def narrowed(looped: LaunchConfig) -> LaunchConfig:
    """A looped column tile narrowed to MIN_COLUMN_XBLOCK columns (32 bytes of bf16 per row), as tall: where the
    rows cannot be split, only the columns give programs."""
    if looped.XBLOCK <= MIN_COLUMN_XBLOCK:
        return looped
    return replace(looped, XBLOCK=MIN_COLUMN_XBLOCK, RBLOCK=looped.XBLOCK * looped.RBLOCK // MIN_COLUMN_XBLOCK)


def split(looped: LaunchConfig, xnumel: int, rnumel: int, rsplit: int) -> LaunchConfig:
    """`looped` with its rows cut into about `rsplit` chunks of whole blocks (itself when under 2 chunks). The
    chunk count is then what the chunks' length needs, so no chunk is empty."""
    if rsplit < 2:
        return looped
    rchunk = _ceil_div(_ceil_div(rnumel, rsplit), looped.RBLOCK) * looped.RBLOCK
    rsplit = _ceil_div(rnumel, rchunk)
    if rsplit < 2:
        return looped
    combine_x = max(1, min(next_pow2(xnumel), COMBINE_ELEMENTS // next_pow2(rsplit)))
    return LaunchConfig("split", looped.XBLOCK, looped.RBLOCK, looped.num_warps, looped.index_dtype, rsplit, rchunk,
                        combine_x)


def _warps(elements: int, per_warp: int) -> int:
    return max(1, min(8, elements // per_warp))


def candidates(group: KernelGroup, layouts: dict, limit: int = 8) -> list[LaunchConfig]:
    """Configurations max-autotune benchmarks for `group`: the heuristic's choice first, then variants around
    it (block sizes, num_warps; a looped form of a persistent or split reduction), at most `limit`."""
    base = choose(group, layouts)
    out = [base]
    xnumel = _static(product(group.outer))
    xcap = 1 << 30 if xnumel is None else next_pow2(xnumel)
    idx = base.index_dtype
    more: list[LaunchConfig] = []
    if base.kind == "tiled":
        shapes = ((32, 64, 4), (64, 32, 4), (128, 32, 8), (64, 64, 8)) if base.RBLOCK == 64 else \
            ((base.XBLOCK // 2, base.RBLOCK, 4), (base.XBLOCK * 2, base.RBLOCK, 8))  # rows: the whole short dim
        more += [LaunchConfig("tiled", x, r, w, idx) for x, r, w in shapes]
        more.append(LaunchConfig("pointwise", 1024, 1, 4, idx))
    elif base.kind == "pointwise":
        for x in (1024, 512, 2048, 256, 128):
            if x <= max(xcap, 128):
                more += [LaunchConfig("pointwise", x, 1, _warps(x, 256), idx),
                         LaunchConfig("pointwise", x, 1, _warps(x, 128), idx)]
    else:
        rnumel = _static(product(group.inner))
        rcap = 1 << 30 if rnumel is None else next_pow2(rnumel)
        if base.kind == "persistent":
            for x in (1, 2, 4, 8, 16, 32, 64, 128):
                if x <= xcap and x * base.RBLOCK <= 2 * BLOCK_ELEMENTS and x != base.XBLOCK:
                    more.append(LaunchConfig("persistent", x, base.RBLOCK, _warps(x * base.RBLOCK, 256), idx))
        if not reduction_is_contiguous(group):  # other column tiles and split targets, before the row shapes
            more += [column_reduction(xnumel, rnumel, idx, width, tile, programs, reads_back(group))
                     for width, tile, programs in COLUMN_CANDIDATES]
        small = [(1, max(16, rcap // 2)), (2, max(16, rcap // 4))] if rcap <= 2 * PERSISTENT_MAX_RBLOCK else []
        for x, r in small + [(1, 2048), (1, 1024), (4, 512), (8, 512), (16, 256), (32, 128), (64, 64), (2, 1024)]:
            if x <= xcap and r <= max(rcap, 64) and (x, r) != (base.XBLOCK, base.RBLOCK):
                more.append(LaunchConfig("looped", x, r, _warps(x * r, 256), idx))
    seen = {base}
    for c in more:
        if c not in seen and len(out) < limit:
            seen.add(c)
            out.append(c)
    return out


def label(cfg: LaunchConfig) -> str:
    """A candidate's name in logs and in the autotune cache."""
    parts = [cfg.kind, f"XBLOCK={cfg.XBLOCK}"]
    if cfg.kind != "pointwise":
        parts.append(f"RBLOCK={cfg.RBLOCK}")
    if cfg.kind == "split":
        parts.append(f"RSPLIT={cfg.RSPLIT}")
    parts.append(f"num_warps={cfg.num_warps}")
    return " ".join(parts)

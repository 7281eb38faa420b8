"""Which 64-key tiles a Gluon sparse MLA program (kernels/sparse_mla_gluon.py) takes, and in what order
its gatherer walks them: a split grid's program one split of a (row, head block) unit's top-k range;
a balanced grid's an equal share of all units' tiles, as runs of one unit each."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import sparse_mla_gluon_tiles as tile


@gluon.jit
def split_unit(topk, keys_per_split, num_splits, H: gl.constexpr):
    """A split grid's program: its row n, head block h0, split, top-k range lo .. end, and its partial
    rows' first index (rows [N, num_splits, H] of the partials)."""
    pid = gl.program_id(0)
    h0 = (pid % (H // 64)) * 64
    split = pid // (H // 64) % num_splits
    n = pid // (H // 64) // num_splits
    lo = split * keys_per_split
    return n, h0, split, lo, gl.minimum(lo + keys_per_split, topk), (n * num_splits + split) * H + h0


@gluon.jit
def balanced_share(tiles_per_unit, total_tiles, PAIR: gl.constexpr):
    """A balanced grid's program: its share of all units' 64-key tiles, flattened unit by unit
    (first .. last - 1, an equal share a program), and the runs it makes of them, a run being its
    tiles of one unit. A unit is a (row, head block) of 64 heads, or with PAIR of 128, whose two
    halves the two CTAs of a cluster take: the pair is one program."""
    if PAIR:
        program = gl.program_id(0) // 2
        programs = gl.num_programs(0) // 2
    else:
        program = gl.program_id(0)
        programs = gl.num_programs(0)
    first = program * total_tiles // programs
    last = (program + 1) * total_tiles // programs
    return first, last, (last - 1) // tiles_per_unit - first // tiles_per_unit + 1


@gluon.jit
def balanced_rows(tiles_per_unit, total_tiles, H: gl.constexpr, PAIR: gl.constexpr):
    """A balanced grid's rows: its units are each row's head blocks of 64 heads, or 128 with PAIR."""
    if PAIR:
        return total_tiles // tiles_per_unit // (H // 128)
    else:
        return total_tiles // tiles_per_unit // (H // 64)


@gluon.jit
def balanced_unit(u, tiles_per_unit, total_tiles, H: gl.constexpr, PAIR: gl.constexpr):
    """A balanced grid's unit u: its row n and this CTA's head block h0. Units run head block by
    head block (all rows' first block, then all rows' next), so that at an even program count
    program c and program c + programs / 2 take the same row's tiles at the same time, for the two
    head blocks of 128 heads one CTA a program, and the second reads the keys the first brought
    into L2. A pair's CTAs take the two halves of a 128-head block."""
    rows = balanced_rows(tiles_per_unit, total_tiles, H, PAIR)
    if PAIR:
        return u % rows, (u // rows * 2 + gl.program_id(0) % 2) * 64
    else:
        return u % rows, u // rows * 64


@gluon.jit
def balanced_run(g, last, r, topk, tiles_per_unit, total_tiles, H: gl.constexpr, PAIR: gl.constexpr):
    """A balanced program's run r, from tile g: its row n, head block h0, top-k range lo .. end,
    whether that is only part of the unit's range (its output then float32 partials), its partial
    rows and where the next run starts. Only a program's first and last runs can be partial: they
    write partial rows (program, 0) and (program, 1)."""
    u = g // tiles_per_unit
    t0 = g - u * tiles_per_unit
    t1 = gl.minimum(last - u * tiles_per_unit, tiles_per_unit)
    n, h0 = balanced_unit(u, tiles_per_unit, total_tiles, H, PAIR)
    part_row = (gl.program_id(0) * 2 + gl.minimum(r, 1)) * 64  # a CTA's own rows
    return (n, h0, t0 * 64, gl.minimum(t1 * 64, topk), (t0 > 0) | (t1 < tiles_per_unit), part_row,
            u * tiles_per_unit + t1)


@gluon.jit
def program_tiles(idx_ptr, stride_idx, topk, keys_per_split, num_splits, tiles_per_unit, total_tiles,
                  H: gl.constexpr, BALANCED: gl.constexpr, PAIR: gl.constexpr):
    """What a gatherer walks (next_tile): the row and first entry of the program's first tile, how
    many tiles it has, the end of their entries, and for a balanced grid the entry at which a unit
    ends (the walk then goes on at the next row's entry 0) and the rows a head block has."""
    if BALANCED:
        first, last, runs = balanced_share(tiles_per_unit, total_tiles, PAIR)
        u = first // tiles_per_unit
        n, h0 = balanced_unit(u, tiles_per_unit, total_tiles, H, PAIR)
        return (n, (first - u * tiles_per_unit) * 64, last - first, topk, tiles_per_unit * 64,
                balanced_rows(tiles_per_unit, total_tiles, H, PAIR))
    else:
        n, h0, split, lo, end, part_row = split_unit(topk, keys_per_split, num_splits, H)
        return n, lo, tile.num_tiles(lo, end), end, end, 1


@gluon.jit
def next_tile(n, j0, t, n_tiles, end, unit_end, rows, BALANCED: gl.constexpr):
    """The tile after tile t, row n's entries j0 .. j0 + 63, and the end of its entries (none past the
    program's last tile): the row's next 64 entries, or in a balanced grid at the end of a unit the
    next row's first (rows of one head block in turn, balanced_unit). No division a tile: the FP8
    gatherer's loop is the kernel's busiest."""
    if BALANCED:
        j0 = j0 + 64
        wrap = j0 >= unit_end
        return (gl.where(wrap, gl.where(n + 1 == rows, 0, n + 1), n), gl.where(wrap, 0, j0),
                gl.where(t + 1 < n_tiles, end, 0))
    else:
        return n, j0 + 64, end

"""Sparse MLA on Hopper, in Gluon: three warpgroups with one job each, so that the next key tile is
gathered (and dequantized, from an FP8 pool) while the tensor cores work on this one.

Same contract as kernels/sparse_mla.py, which launches it: one program takes 64 heads of one query
row over its top-k range, 64 keys per tile. Shared memory holds Q, two bf16 key buffers and P
(~226 KB), so one program runs per SM. The warpgroups (gl.warp_specialize):

- the scorer: its heads' Q into shared memory while the gatherer fetches the first tile (loaded
  before the partitions start, it held the gatherer back: 1-5% at every decode shape), then QK of
  a whole tile (Q read from shared memory once a tile), the online softmax, P and its rows'
  rescale factors, and P V into value columns 0..255;
- the second warpgroup: P V into columns 256..511 while the scorer moves on to the next tile;
- the gatherer: tile t by cp.async into key buffer t % 2 once both MMA warpgroups are done with
  tile t - 2, and each row's validity beside it for the scorer's mask. A bf16 pool's rows land in
  place. An FP8 pool's rows land raw (512 e4m3 bytes) in the upper half of the buffer's bytes,
  their scales and rope dims beside, and the gatherer rewrites the tile in place as bf16 rows
  (each 128-wide tile times its scale in fp32, then one bf16 rounding; FlashMLA rounds the scale to
  bf16 first and multiplies in bf16, docs/PERFORMANCE.md). Until the twelfth
  session FP8 pools had eight warps in one stream dequantizing under PV; taking the
  dequantization off the MMA warps made FP8 decode 6-23% faster (docs/PERFORMANCE.md).

Synchronization is by mbarriers: `ready` / `free` per key buffer (gatherer -> scorer; both MMA
warpgroups -> gatherer), `p_ready` / `p_free` for P, `done` for the scorer's final 1 / l, and in a
balanced grid `q_free` (the second warpgroup is done with a run's output, the scorer may load the
next run's Q). Each partition passes its own barrier before one of its threads arrives. A bf16
output leaves through shared memory no product reads any more, in 16-byte row stores
(_store_columns, _stage).

At 128 heads over an FP8 pool the dequantization bounds the kernel, and a row's two head blocks each
dequantized every tile. Unsplit rows (batch 45-66, and the whole waves from 66 on, at top-k 2048)
run them as a CTA pair, one thread-block cluster (kernels/cta_pair.py): each copies and dequantizes
half of every tile's value columns and pushes them into the other's key buffer (_gather_fp8_pair),
bit for bit the one-CTA kernel's output, 1.04-1.06x faster (H100, docs/PERFORMANCE.md, "CTA pairs").
A balanced grid's programs are pairs too (its units then 128 heads, a CTA a half), 1.01-1.08x one
CTA a program.

A split top-k range leaves float32 partials. At two or four splits in one wave (MERGES;
sparse_mla.mla_config's at batch 9-16 and 23-33 of 128 heads), where the launch is cooperative (all of a grid's programs resident at once),
the splits of a (row, head block) meet at a counter in global memory (kernels/grid_barrier.py) and
each merges a 1 / MERGE share of the value columns (_merge_share): its own part of that share
stays in shared memory, over the key buffers (_keep_share), and only the others' parts go through
L2. That halves the partials written and read at two splits and saves the merge launch (H100:
1.05-1.09x the op at batch 16-32, docs/PERFORMANCE.md, "The splits merged where they meet").
Otherwise sparse_mla's merge kernel merges them, one launch later.

A grid of whole or split units leaves SMs idle in its last wave. A balanced grid (BALANCED,
launch_balanced; mla_config's at batch 34-41 of 128 heads, and for the rows past whole waves of
unsplit programs where they fill half a wave or less: 67-99, 133-165... of 128 heads) has one
program an SM (a CTA pair two), each taking an equal share of all units' tiles (_runs), unit after
unit, head block by head block (_unit), as runs of one unit each (_run). The warpgroups loop over
the runs with their tile and mbarrier phase counts carried through; the gatherer walks the tiles
without knowing where a run ends (_next_tile). A run over a whole unit writes bf16 output, bit for
bit the unsplit grid's; a program's first and last runs, where they cover part of a unit, write
float32 partials, which sparse_mla's balanced merge joins (1.03-1.35x the split grid at those
batches on the H100, docs/PERFORMANCE.md, "A balanced grid for the batches between waves").
"""

from __future__ import annotations

import functools
import logging

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)

from dsa_backend.cache.layout import MLA_FP8_BYTES as _MLA_FP8_BYTES

from . import cta_pair, grid_barrier
from .device import num_sms
from .gluon_compat import barrier, cp_async, reinterpret

MLA_FP8_BYTES = gl.constexpr(_MLA_FP8_BYTES)
BLOCK_H = 64  # heads per program: the wgmma M dimension
BLOCK_N = 64  # keys per tile
NUM_WARPS = 4  # the scorer's warpgroup; the other two come on top
# Registers per thread of the partitions; the scorer gets 192. From ptxas 12.8 for sm_90a: with
# the second warpgroup under 160 it ignores setmaxnreg (C7507), and with the gatherer at 160 too
# (the three at the full 512) it serializes the scorer's wgmma chain (C7512: 50% slower on the H200).
SECOND_REGS = gl.constexpr(160)
GATHER_REGS = gl.constexpr(152)


# ---------------------------------------------------------------- layouts and shared pieces

# Register layouts of one warpgroup.
QK = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
PV = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16]))
LATENT = gl.constexpr(gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0]))  # bf16 rows: a warp per row, 16 bytes a thread
RAW = gl.constexpr(gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0]))  # e4m3 rows, the same way
SCALES = gl.constexpr(gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]))  # a row's four fp32 scales to one thread
ROPE_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))  # 64 bf16 rope dims a row
# Raw e4m3 rows [rows, 4, 128] read back for dequantization, 16 bytes a thread: a warp's lanes take
# 128 columns of four rows, so that neither the raw loads nor the swizzled bf16 stores conflict (a
# warp over one whole row puts eight lanes' stores in each bank group).
DEQUANT = gl.constexpr(gl.BlockedLayout([1, 1, 16], [4, 1, 8], [4, 1, 1], [2, 1, 0]))
# A pair's raw rows (256 e4m3 bytes, half a row), and a [64, 64] block of them for dequantization.
RAW_HALF = gl.constexpr(gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0]))
DEQUANT_BLOCK = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))
# the split counts that merge where they meet: from 8 splits (batch 8 and below at 128 heads) the
# merge kernel, whose reads spread over every SM, is as fast or faster (H100, docs/PERFORMANCE.md)
MERGES = (2, 4)
_KERNEL = "the Gluon sparse MLA kernel's merge"
log = logging.getLogger(__name__)


@gluon.jit
def _entries(idx_row, j0, end, LAYOUT: gl.constexpr):
    """Top-k entries j0 .. j0 + 63 along dimension 0 of LAYOUT (-1 past the split's end)."""
    j = j0 + gl.arange(0, 64, layout=gl.SliceLayout(1, LAYOUT))
    return gl.load(idx_row + j, mask=j < end, other=-1)


@gluon.jit
def _copy_rows(dst, src_ptr, idx, num_slots, stride, first: gl.constexpr, LAYOUT: gl.constexpr):
    """cp.async of columns first .. first + width - 1 of the pool rows idx names into dst [64, width];
    src_ptr and stride count dst's elements. Invalid entries (-1, past the slots) land as zeros."""
    ok = _valid(idx, num_slots)
    row = gl.where(ok, idx, 0).to(gl.int64) * stride
    col = first + gl.arange(0, dst.shape[1], layout=gl.SliceLayout(0, LAYOUT))
    cp_async(dst, src_ptr + row[:, None] + col[None, :], mask=ok[:, None])


@gluon.jit
def _num_tiles(lo, end):
    """64-key tiles in the top-k range lo .. end (none for an empty split)."""
    return gl.cdiv(gl.maximum(end - lo, 0), 64)


@gluon.jit
def _qk(q_lat, q_rope, k_lat, k_rope, s_zero):
    """Issue QK of one tile (the 512 latent dims, then the 64 rope dims into the same accumulator)."""
    s = warpgroup_mma(q_lat, k_lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_rope, k_rope.permute((1, 0)), s, is_async=True)


@gluon.jit
def _valid(idx, num_slots):
    """Which top-k entries name a pool slot (-1 pads, and nothing past the pool counts)."""
    return (idx >= 0) & (idx < num_slots)


@gluon.jit
def _online_softmax(s, ok, scale_log2, m_i, l_i):
    """One QK tile through the online softmax (log2 domain; entries not ok masked): P, the factor
    that rescales what came before, and the new running max and sum."""
    s = gl.where(ok[None, :], s * scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing valid yet
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _inverse_sum(l_i):
    """1 / l per row, 0 for a row that saw no valid entry."""
    has = l_i > 0
    return gl.where(has, 1.0 / gl.where(has, l_i, 1.0), 0.0)


@gluon.jit
def _store_columns(acc, inv, part_ptr, out_ptr, part_row, row, c0, stage, partial):
    """Value columns c0 .. c0 + 255 of a run's output from acc [64, 256] (layout PV) times 1 / l: float32
    partials in rows part_row .. part_row + 63 of part_ptr when the run covers only part of its top-k
    range, else bf16 in rows row .. row + 63 (n * H + h0) of out_ptr. bf16 goes through `stage` (_stage)
    and leaves in 16-byte row-contiguous stores: straight from the MMA layout they were 4-byte stores,
    ~8% of the kernel's time in a prefill profile."""
    o = acc * gl.convert_layout(inv, gl.SliceLayout(1, PV), assert_trivial=True)[:, None]
    if partial:
        rows = part_row + gl.arange(0, 64, layout=gl.SliceLayout(1, PV))
        cols = c0 + gl.arange(0, 256, layout=gl.SliceLayout(0, PV))
        gl.store(part_ptr + rows.to(gl.int64)[:, None] * 512 + cols[None, :], o)
    else:
        stage.store(o.to(gl.bfloat16))
        barrier()  # (the storing warps' barrier) the whole [64, 256] is staged
        h = row + gl.arange(0, 64, layout=gl.SliceLayout(1, LATENT))
        col = c0 + gl.arange(0, 256, layout=gl.SliceLayout(0, LATENT))
        gl.store(out_ptr + h.to(gl.int64)[:, None] * 512 + col[None, :], stage.load(LATENT))


@gluon.jit
def _store_lse(m_i, l_i, part_lse_ptr, lse_ptr, part_row, row, partial, ROWS: gl.constexpr):
    """Each head's log-sum-exp: base 2 beside the partials for a merge, natural log otherwise."""
    has = l_i > 0
    lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    h = gl.arange(0, 64, layout=ROWS)
    if partial:
        gl.store(part_lse_ptr + part_row + h, lse)
    else:
        gl.store(lse_ptr + row + h, lse * 0.6931471805599453)


@gluon.jit
def _stage(q_lat, k_lat, n_tiles, c0: gl.constexpr, BALANCED: gl.constexpr):
    """Where a run's bf16 columns c0 .. c0 + 255 wait for their 16-byte stores: in a balanced grid Q's
    buffer (the run's QKs are done with it, and the gatherer may be filling both key buffers with
    the next run's tiles; the scorer's next Q waits for q_free); else the key buffer that last held
    tile n_tiles - 2, whose products are done."""
    if BALANCED:
        return q_lat.slice(c0, 256, dim=1)
    else:
        return k_lat.index(n_tiles % 2).slice(c0, 256, dim=1)


# ---------------------------------------------------------------- a program's runs of tiles

@gluon.jit
def _split_unit(topk, keys_per_split, num_splits, H: gl.constexpr):
    """A split grid's program: its row n, head block h0, split, top-k range lo .. end, and its partial
    rows' first index (rows [N, num_splits, H] of the partials)."""
    pid = gl.program_id(0)
    h0 = (pid % (H // 64)) * 64
    split = pid // (H // 64) % num_splits
    n = pid // (H // 64) // num_splits
    lo = split * keys_per_split
    return n, h0, split, lo, gl.minimum(lo + keys_per_split, topk), (n * num_splits + split) * H + h0


@gluon.jit
def _runs(tiles_per_unit, total_tiles, PAIR: gl.constexpr):
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
def _rows(tiles_per_unit, total_tiles, H: gl.constexpr, PAIR: gl.constexpr):
    """A balanced grid's rows: its units are each row's head blocks of 64 heads, or 128 with PAIR."""
    if PAIR:
        return total_tiles // tiles_per_unit // (H // 128)
    else:
        return total_tiles // tiles_per_unit // (H // 64)


@gluon.jit
def _unit(u, tiles_per_unit, total_tiles, H: gl.constexpr, PAIR: gl.constexpr):
    """A balanced grid's unit u: its row n and this CTA's head block h0. Units run head block by
    head block (all rows' first block, then all rows' next), so that at an even program count
    program c and program c + programs / 2 take the same row's tiles at the same time, for the two
    head blocks of 128 heads one CTA a program, and the second reads the keys the first brought
    into L2. A pair's CTAs take the two halves of a 128-head block."""
    rows = _rows(tiles_per_unit, total_tiles, H, PAIR)
    if PAIR:
        return u % rows, (u // rows * 2 + gl.program_id(0) % 2) * 64
    else:
        return u % rows, u // rows * 64


@gluon.jit
def _run(g, last, r, topk, tiles_per_unit, total_tiles, H: gl.constexpr, PAIR: gl.constexpr):
    """A balanced program's run r, from tile g: its row n, head block h0, top-k range lo .. end,
    whether that is only part of the unit's range (its output then float32 partials), its partial
    rows and where the next run starts. Only a program's first and last runs can be partial: they
    write partial rows (program, 0) and (program, 1)."""
    u = g // tiles_per_unit
    t0 = g - u * tiles_per_unit
    t1 = gl.minimum(last - u * tiles_per_unit, tiles_per_unit)
    n, h0 = _unit(u, tiles_per_unit, total_tiles, H, PAIR)
    part_row = (gl.program_id(0) * 2 + gl.minimum(r, 1)) * 64  # a CTA's own rows
    return (n, h0, t0 * 64, gl.minimum(t1 * 64, topk), (t0 > 0) | (t1 < tiles_per_unit), part_row,
            u * tiles_per_unit + t1)


# ---------------------------------------------------------------- the splits' merge

@gluon.jit
def _arrive(counter, MERGE: gl.constexpr):
    """Count this split in at its group's counter (128 / MERGE), after the barrier that puts every
    thread's stores before the release; returns the count before."""
    barrier()
    return gl.atomic_add(counter, 128 // MERGE, sem="acq_rel", scope="gpu")


@gluon.jit
def _wait_for_the_group(counter, arrived):
    """Wait until the counter reaches the multiple of 128 after `arrived` (this group's count before
    one of this program's arrivals): every split's partials are then visible."""
    target = (arrived & -128) + 128
    while gl.atomic_add(counter, 0, sem="acquire", scope="gpu") - target < 0:
        pass
    barrier()


@gluon.jit
def _keep_share(acc, inv, o_smem, free, n_tiles, part_ptr, n, split, h0, c0, H: gl.constexpr, MERGE: gl.constexpr):
    """A warpgroup's value columns c0 .. c0 + 255 times 1 / l, float32, once both MMA warpgroups are
    done with the key buffers (the last tile's `free`): all of them into o_smem ([share, head,
    column], over those buffers), and to the split's partials in global memory only the columns
    other splits merge."""
    COLS: gl.constexpr = 512 // MERGE
    o = acc * gl.convert_layout(inv, gl.SliceLayout(1, PV), assert_trivial=True)[:, None]
    if n_tiles > 0:
        mbarrier.wait(free.index((n_tiles - 1) % 2), ((n_tiles - 1) // 2) & 1)
    shares = gl.permute(gl.reshape(o, [64, 256 // COLS, COLS]), [1, 0, 2])
    o_smem.slice(c0 // COLS, 256 // COLS, dim=0).store(shares)
    h = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, PV))
    col = c0 + gl.arange(0, 256, layout=gl.SliceLayout(0, PV))
    gl.store(part_ptr + ((n * MERGE + split) * H + h).to(gl.int64)[:, None] * 512 + col[None, :], o,
             mask=(col // (512 // MERGE) != split)[None, :])


@gluon.jit
def _merge_share(o_smem, part_ptr, part_lse_ptr, out_ptr, lse_ptr, n, split, h0, H: gl.constexpr,
                 MERGE: gl.constexpr):
    """Split `split`'s share of its group's merge, as sparse_mla's merge kernel does it: value columns
    split * 512 / MERGE onwards of its 64 heads, every split's partials weighted by their
    log-sum-exp (its own from o_smem, the others' from L2), out in bf16; split 0 writes the
    natural-log lse. Each thread holds every split of its columns, 16 bytes of each: a pass takes
    64 / MERGE columns (32 registers a thread; 128 / MERGE spilled in the scorer's loop at two
    splits, ptxas for sm_90, Triton 3.9)."""
    COLS: gl.constexpr = 512 // MERGE
    WIDTH: gl.constexpr = 64 // MERGE
    LANES: gl.constexpr = WIDTH // 4
    L3: gl.constexpr = gl.BlockedLayout([MERGE, 1, 4], [1, 32 // LANES, LANES], [1, 4, 1], [2, 1, 0])
    HEADS: gl.constexpr = gl.SliceLayout(2, L3)
    OUT: gl.constexpr = gl.SliceLayout(0, L3)
    s = gl.arange(0, MERGE, layout=gl.SliceLayout(1, HEADS))
    h = h0 + gl.arange(0, 64, layout=gl.SliceLayout(0, HEADS))
    part = (n * MERGE + s[:, None]) * H + h[None, :]  # [MERGE, 64]
    lse = gl.load(part_lse_ptr + part, cache_modifier=".cg")
    top = gl.max(lse, axis=0)
    top = gl.where(top == float("-inf"), 0.0, top)  # every split empty: weights 0, lse -inf
    w = gl.exp2(lse - top[None, :])
    total = gl.sum(w, axis=0)
    has = total > 0
    safe = gl.where(has, total, 1.0)
    if split == 0:
        gl.store(lse_ptr + n * H + h, gl.where(has, (top + gl.log2(safe)) * 0.6931471805599453, float("-inf")))
    inv = gl.convert_layout(gl.where(has, 1.0 / safe, 0.0), gl.SliceLayout(1, OUT))
    rows = part.to(gl.int64)[:, :, None] * 512
    col_in = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    mine = (s == split)[:, None, None]
    others = (s != split)[:, None, None]
    # o_smem's bytes as shares of a rank-2 layout, which can take a runtime index
    own = reinterpret(o_smem, gl.float32, [MERGE, 64, COLS], gl.SwizzledSharedLayout(4, 1, 8, [1, 0])).index(split)
    col_out = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, OUT))[None, :]
    h_out = (n * H + h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, OUT))).to(gl.int64)[:, None] * 512
    for c in gl.static_range(0, COLS, WIDTH):
        first = split * COLS + c
        vals = gl.load(part_ptr + rows + first + col_in, mask=others, other=0.0, cache_modifier=".cg")
        vals = gl.where(mine, own.slice(c, WIDTH, dim=1).load(OUT)[None, :, :], vals)
        o = gl.sum(vals * w[:, :, None], axis=0) * inv[:, None]
        gl.store(out_ptr + h_out + first + col_out, o.to(gl.bfloat16))


# ---------------------------------------------------------------- the gatherers

@gluon.jit
def _dequantize(k_lat, raw, scales):
    """Rewrite the raw e4m3 tile in `raw` (which overlaps k_lat) as bf16 rows in k_lat, each 128-wide
    tile times its scale, in two halves of 32 rows."""
    SL: gl.constexpr = gl.SliceLayout(2, DEQUANT)
    lat_a = raw.slice(0, 32).load(DEQUANT)
    lat_b = raw.slice(32, 32).load(DEQUANT)
    scale_a = scales.slice(0, 32).load(SL)
    scale_b = scales.slice(32, 32).load(SL)
    barrier()  # every thread holds its raw rows before any bf16 row overwrites them
    k_lat.slice(0, 32).store(gl.reshape((lat_a.to(gl.float32) * scale_a[:, :, None]).to(gl.bfloat16), [32, 512]))
    k_lat.slice(32, 32).store(gl.reshape((lat_b.to(gl.float32) * scale_b[:, :, None]).to(gl.bfloat16), [32, 512]))


@gluon.jit
def _tile_entries(idx_row, j0, end):
    """Tile j0's top-k entries in the layouts _fetch_fp8_tile copies by."""
    return (_entries(idx_row, j0, end, RAW), _entries(idx_row, j0, end, SCALES), _entries(idx_row, j0, end, ROPE_ROWS))


@gluon.jit
def _fetch_fp8_tile(buf, entries, k_rope, raw2, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots):
    """Start the cp.async copies of a tile (its _tile_entries) into key buffer buf: the raw latent into
    the buffer's upper half, its scales, and the rope dims. One commit group."""
    lat_idx, scale_idx, rope_idx = entries
    _copy_rows(raw2.index(2 * buf + 1), kv_ptr, lat_idx, num_slots, stride_kv, 0, RAW)
    _copy_rows(scales, kv_f32_ptr, scale_idx, num_slots, MLA_FP8_BYTES // 4, 128, SCALES)
    # a constant row stride, so cp.async sees 16-byte aligned rows
    _copy_rows(k_rope.index(buf), kv_bf16_ptr, rope_idx, num_slots, MLA_FP8_BYTES // 2, 264, ROPE_ROWS)
    async_copy.commit_group()


@gluon.jit
def _program_tiles(idx_ptr, stride_idx, topk, keys_per_split, num_splits, tiles_per_unit, total_tiles,
                   H: gl.constexpr, BALANCED: gl.constexpr, PAIR: gl.constexpr):
    """What a gatherer walks (_next_tile): the row and first entry of the program's first tile, how
    many tiles it has, the end of their entries, and for a balanced grid the entry at which a unit
    ends (the walk then goes on at the next row's entry 0) and the rows a head block has."""
    if BALANCED:
        first, last, runs = _runs(tiles_per_unit, total_tiles, PAIR)
        u = first // tiles_per_unit
        n, h0 = _unit(u, tiles_per_unit, total_tiles, H, PAIR)
        return (n, (first - u * tiles_per_unit) * 64, last - first, topk, tiles_per_unit * 64,
                _rows(tiles_per_unit, total_tiles, H, PAIR))
    else:
        n, h0, split, lo, end, part_row = _split_unit(topk, keys_per_split, num_splits, H)
        return n, lo, _num_tiles(lo, end), end, end, 1


@gluon.jit
def _next_tile(n, j0, t, n_tiles, end, unit_end, rows, BALANCED: gl.constexpr):
    """The tile after tile t, row n's entries j0 .. j0 + 63, and the end of its entries (none past the
    program's last tile): the row's next 64 entries, or in a balanced grid at the end of a unit the
    next row's first (rows of one head block in turn, _unit). No division a tile: the FP8 gatherer's
    loop is the kernel's busiest."""
    if BALANCED:
        j0 = j0 + 64
        wrap = j0 >= unit_end
        return (gl.where(wrap, gl.where(n + 1 == rows, 0, n + 1), n), gl.where(wrap, 0, j0),
                gl.where(t + 1 < n_tiles, end, 0))
    else:
        return n, j0 + 64, end


@gluon.jit
def _gather(k_lat, k_rope, valid, ready, free, kv_ptr, stride_kv, num_slots, idx_ptr, stride_idx, topk,
            keys_per_split, num_splits, tiles_per_unit, total_tiles, H: gl.constexpr, BALANCED: gl.constexpr):
    """The gatherer: the program's tile t (counting through its runs) copied by cp.async into buffer
    t % 2 once both MMA warpgroups are done with tile t - 2, from entries loaded a tile earlier;
    and which of its rows are valid, into valid[t % 2], so that the scorer's mask costs no global
    load."""
    n, j0, n_tiles, end, unit_end, rows = _program_tiles(idx_ptr, stride_idx, topk, keys_per_split, num_splits,
                                                         tiles_per_unit, total_tiles, H, BALANCED, False)
    lat_idx = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, end, LATENT)
    rope_idx = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, end, ROPE_ROWS)
    for t in range(n_tiles):
        b = t % 2
        n, j0, j_end = _next_tile(n, j0, t, n_tiles, end, unit_end, rows, BALANCED)
        lat_next = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, j_end, LATENT)
        rope_next = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, j_end, ROPE_ROWS)
        if t >= 2:
            mbarrier.wait(free.index(b), (t // 2 - 1) & 1)
        _copy_rows(k_lat.index(b), kv_ptr, lat_idx, num_slots, stride_kv, 0, LATENT)
        _copy_rows(k_rope.index(b), kv_ptr, rope_idx, num_slots, stride_kv, 512, ROPE_ROWS)
        async_copy.commit_group()
        valid.index(b).store(_valid(rope_idx, num_slots).to(gl.int8))
        lat_idx = lat_next
        rope_idx = rope_next
        async_copy.wait_group(0)
        fence_async_shared()
        barrier()  # (this warpgroup's barrier) every thread's copies have landed
        mbarrier.arrive(ready.index(b))


@gluon.jit
def _gather_fp8(k_lat, k_rope, raw2, raw3, scales, valid, ready, free, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv,
                num_slots, idx_ptr, stride_idx, topk, keys_per_split, num_splits, tiles_per_unit, total_tiles,
                H: gl.constexpr, BALANCED: gl.constexpr):
    """The FP8 gatherer: as _gather, but tile t lands raw in the upper half of buffer t % 2 (its
    scales beside) and is rewritten there as bf16 before the scorer hears of it."""
    tiles = (k_rope, raw2, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots)
    n, j0, n_tiles, end, unit_end, rows = _program_tiles(idx_ptr, stride_idx, topk, keys_per_split, num_splits,
                                                         tiles_per_unit, total_tiles, H, BALANCED, False)
    entries = _tile_entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, end)
    for t in range(n_tiles):
        b = t % 2
        if t >= 2:
            mbarrier.wait(free.index(b), (t // 2 - 1) & 1)
        _fetch_fp8_tile(b, entries, *tiles)
        valid.index(b).store(_valid(entries[2], num_slots).to(gl.int8))
        n, j0, j_end = _next_tile(n, j0, t, n_tiles, end, unit_end, rows, BALANCED)
        entries = _tile_entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, j_end)
        async_copy.wait_group(0)
        barrier()  # (this warpgroup's barrier) every thread's copies have landed
        _dequantize(k_lat.index(b), raw3.index(2 * b + 1), scales)
        fence_async_shared()
        barrier()  # (this warpgroup's barrier) the whole bf16 tile is in place
        mbarrier.arrive(ready.index(b))


@gluon.jit
def _dequantize_and_push(k_lat, raw_half, scales, ready, free_peer, t, b, R: gl.constexpr, READY_AT: gl.constexpr,
                         FREE_PEER_AT: gl.constexpr):
    """A pair's gatherer of rank R: its value columns 256 R .. 256 R + 255 of tile t (raw in the first
    16 KB of their 32 KB region of key buffer b) rewritten there as bf16, a 64-column block at a
    time; its arrival on ready[b], which then waits for the peer's half too; and, once the peer's
    MMAs are done with the peer's buffer b, the region pushed there."""
    raw = raw_half.index(4 * b + 2 * R)
    lat0 = raw.slice(0, 64, dim=1).load(DEQUANT_BLOCK)
    lat1 = raw.slice(64, 64, dim=1).load(DEQUANT_BLOCK)
    lat2 = raw.slice(128, 64, dim=1).load(DEQUANT_BLOCK)
    lat3 = raw.slice(192, 64, dim=1).load(DEQUANT_BLOCK)
    scale0 = scales.slice(2 * R, 1, dim=1).load(DEQUANT_BLOCK)  # each 128 columns' scale
    scale1 = scales.slice(2 * R + 1, 1, dim=1).load(DEQUANT_BLOCK)
    barrier()  # every thread holds its raw bytes before the bf16 blocks overwrite them
    dst = k_lat.index(b)
    dst.slice(256 * R, 64, dim=1).store((lat0.to(gl.float32) * scale0).to(gl.bfloat16))
    dst.slice(256 * R + 64, 64, dim=1).store((lat1.to(gl.float32) * scale0).to(gl.bfloat16))
    dst.slice(256 * R + 128, 64, dim=1).store((lat2.to(gl.float32) * scale1).to(gl.bfloat16))
    dst.slice(256 * R + 192, 64, dim=1).store((lat3.to(gl.float32) * scale1).to(gl.bfloat16))
    fence_async_shared()
    barrier()  # (this warpgroup's barrier) the half is in place, for the MMAs and the push
    mbarrier.expect(ready.index(b), cta_pair.PUSH_BYTES)
    if t >= 2:
        mbarrier.wait(free_peer.index(b), (t // 2 - 1) & 1)
    # k_lat, the largest allocation, is where Triton's allocator puts it, at global_smem offset 0
    # (elsewhere the pair would not give the one-CTA kernel's bits: its GPU test)
    cta_pair.push(b * 65536 + R * cta_pair.PUSH_BYTES, READY_AT + 8 * b, 1 - R)


@gluon.jit
def _pair_entries(idx_row, j0, end):
    """A pair's top-k entries j0 .. j0 + 63 (none from end) in the layouts of its three copies."""
    return (_entries(idx_row, j0, end, RAW_HALF), _entries(idx_row, j0, end, SCALES),
            _entries(idx_row, j0, end, ROPE_ROWS))


@gluon.jit
def _gather_fp8_pair(k_lat, k_rope, raw_half, scales, valid, ready, free, free_peer, kv_ptr, kv_f32_ptr, kv_bf16_ptr,
                     stride_kv, num_slots, idx_row, lo, end, idx_ptr, stride_idx, topk, tiles_per_unit, total_tiles,
                     H: gl.constexpr, BALANCED: gl.constexpr, READY_AT: gl.constexpr, FREE_PEER_AT: gl.constexpr):
    """The FP8 gatherer of a CTA pair (a 128-head row's two head blocks as one cluster): as
    _gather_fp8, but each CTA copies and dequantizes half of every tile's value columns and pushes
    them into the peer's buffer, so each dequantizes half as much (the FP8 gatherer bounds the
    one-CTA kernel at 128 heads; docs/PERFORMANCE.md, "Half a tile's gather a CTA").

    The handshake: tile t's ready[b] takes this CTA's arrival and the peer's 32 KB; a CTA's
    gatherer, once its own MMAs are done with buffer b, says so on the peer's free_peer[b], which
    the peer waits on before pushing tile t + 2 there. The gatherer sends it, not the MMA
    warpgroups: from them (two remote arrivals a tile) the pair was 0.80x the one-CTA kernel.

    A split grid's pair walks top-k entries lo .. end of the row at idx_row; a balanced grid's both
    CTAs walk their program's runs (_next_tile)."""
    cta_pair.cluster_sync()  # the peer's mbarriers are initialized
    rank = gl.program_id(0) % 2
    n_tiles = _num_tiles(lo, end)
    if BALANCED:
        n, lo, n_tiles, end, unit_end, rows = _program_tiles(idx_ptr, stride_idx, topk, 0, 1, tiles_per_unit,
                                                             total_tiles, H, True, True)
        idx_row = idx_ptr + n.to(gl.int64) * stride_idx
    lat_idx, scale_idx, rope_idx = _pair_entries(idx_row, lo, end)
    for t in range(n_tiles):
        b = t % 2
        if t >= 2:
            mbarrier.wait(free.index(b), (t // 2 - 1) & 1)
            cta_pair.arrive_remote(FREE_PEER_AT + 8 * b, 1 - rank)  # the peer may push tile t here
        # raw half r lands in the first 16 KB of its region of the buffer (raw_half index 4 b + 2 r)
        if rank == 0:
            _copy_rows(raw_half.index(4 * b), kv_ptr, lat_idx, num_slots, stride_kv, 0, RAW_HALF)
        else:
            _copy_rows(raw_half.index(4 * b + 2), kv_ptr, lat_idx, num_slots, stride_kv, 256, RAW_HALF)
        _copy_rows(scales, kv_f32_ptr, scale_idx, num_slots, MLA_FP8_BYTES // 4, 128, SCALES)
        _copy_rows(k_rope.index(b), kv_bf16_ptr, rope_idx, num_slots, MLA_FP8_BYTES // 2, 264, ROPE_ROWS)
        async_copy.commit_group()
        valid.index(b).store(_valid(rope_idx, num_slots).to(gl.int8))
        if BALANCED:  # a tile ahead, under the copies
            n, lo, j_end = _next_tile(n, lo, t, n_tiles, end, unit_end, rows, True)
            idx_row = idx_ptr + n.to(gl.int64) * stride_idx
            lat_idx, scale_idx, rope_idx = _pair_entries(idx_row, lo, j_end)
        else:
            lat_idx, scale_idx, rope_idx = _pair_entries(idx_row, lo + (t + 1) * 64, end)
        async_copy.wait_group(0)
        barrier()  # (this warpgroup's barrier) every thread's copies have landed
        if rank == 0:
            _dequantize_and_push(k_lat, raw_half, scales, ready, free_peer, t, b, 0, READY_AT, FREE_PEER_AT)
        else:
            _dequantize_and_push(k_lat, raw_half, scales, ready, free_peer, t, b, 1, READY_AT, FREE_PEER_AT)
    cta_pair.cluster_sync()  # this CTA's last arrivals on the peer are in before either exits


@gluon.jit
def _score_run(q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem, ready, free,
               p_ready, p_free, done, valid, n, h0, split, lo, end, k, partial, part_row, scale_log2, out_ptr, lse_ptr,
               merged_ptr, merged_lse_ptr, o_smem, H: gl.constexpr, MERGE: gl.constexpr, PAIR: gl.constexpr,
               BALANCED: gl.constexpr):
    """The scorer's run over top-k entries lo .. end of row n, heads h0 .. h0 + 63, the program's
    tiles k onwards: Q into shared memory, QK of each whole tile, the online softmax, P for the
    second warpgroup, and value columns 0..255."""
    q_row = q_ptr + n.to(gl.int64) * stride_qn + (h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ROPE_ROWS)))[:, None] * stride_qh
    col = gl.arange(0, 64, layout=gl.SliceLayout(0, ROPE_ROWS))[None, :]
    for c in gl.static_range(0, 512, 64):  # 64 columns at a time: 16 registers a thread
        q_lat.slice(c, 64, dim=1).store(gl.load(q_row + c + col))
    q_rope.store(gl.load(q_row + 512 + col))
    fence_async_shared()
    barrier()  # (this warpgroup's barrier) all of Q is in place for its wgmma
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, QK))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, QK))
    acc = gl.zeros([64, 256], gl.float32, PV)
    s_zero = gl.zeros([64, 64], gl.float32, QK)
    n_tiles = _num_tiles(lo, end)
    for t in range(k, k + n_tiles):
        b = t % 2
        mbarrier.wait(ready.index(b), (t // 2) & 1)
        s = _qk(q_lat, q_rope, k_lat.index(b), k_rope.index(b), s_zero)
        ok = valid.index(b).load(gl.SliceLayout(0, QK)) != 0  # under the QK
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _online_softmax(s, ok, scale_log2, m_i, l_i)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV), assert_trivial=True)[:, None]
        if t >= 1:
            mbarrier.wait(p_free, (t - 1) & 1)  # the second warpgroup is done with P t - 1
        p_smem.store(p.to(gl.bfloat16))
        alpha_smem.store(alpha)
        fence_async_shared()
        barrier()  # (this warpgroup's barrier) all of P is in place
        mbarrier.arrive(p_ready)
        acc = warpgroup_mma(p_smem, k_lat.index(b).slice(0, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        barrier()  # (this warpgroup's barrier) its PV is done with the key buffer
        mbarrier.arrive(free.index(b))
    if PAIR and not BALANCED:  # (a balanced grid's after its last run: every partition meets it as often)
        cta_pair.cluster_sync()  # the peer's last arrivals on this CTA's mbarriers are in
    inv = _inverse_sum(l_i)
    inv_smem.store(inv)
    barrier()  # (this warpgroup's barrier) 1 / l is in place for the second warpgroup
    mbarrier.arrive(done)
    if MERGE:
        _keep_share(acc, inv, o_smem, free, n_tiles, out_ptr, n, split, h0, 0, H, MERGE)
    else:
        _store_columns(acc, inv, out_ptr, merged_ptr, part_row, n * H + h0, 0, _stage(q_lat, k_lat, n_tiles, 0, BALANCED),
                       partial)
    _store_lse(m_i, l_i, lse_ptr, merged_lse_ptr, part_row, n * H + h0, partial, gl.SliceLayout(1, QK))


@gluon.jit
def _scorer(q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem, ready, free,
            p_ready, p_free, done, q_free, valid, topk, keys_per_split, num_splits, tiles_per_unit, total_tiles,
            scale_log2, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr, o_smem, H: gl.constexpr, PARTIAL: gl.constexpr,
            MERGE: gl.constexpr, PAIR: gl.constexpr, BALANCED: gl.constexpr):
    """Warpgroup 0: the program's runs (_score_run), the first one's Q loaded while the gatherer
    fetches the first tile. A balanced program's later runs wait until the second warpgroup is done
    with the last run's 1 / l and with Q's buffer, where both stage a bf16 output."""
    if PAIR:
        cta_pair.cluster_sync()  # the peer's mbarriers are initialized (every partition meets it)
    run = (q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem, ready, free, p_ready,
           p_free, done, valid)
    out = (scale_log2, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr, o_smem)  # (a tuple's constexprs would not stay so)
    if BALANCED:
        first, last, runs = _runs(tiles_per_unit, total_tiles, PAIR)
        g = first
        for r in range(runs):
            n, h0, lo, end, partial, part_row, g_next = _run(g, last, r, topk, tiles_per_unit, total_tiles, H, PAIR)
            if r > 0:
                mbarrier.wait(q_free, (r - 1) & 1)
                barrier()  # (this warpgroup's barrier) its own warps are done with the staged output too
            _score_run(*run, n, h0, 0, lo, end, g - first, partial, part_row, *out, H, MERGE, PAIR, BALANCED)
            g = g_next
        if PAIR:
            cta_pair.cluster_sync()  # the peer's last arrivals on this CTA's mbarriers are in
    else:
        n, h0, split, lo, end, part_row = _split_unit(topk, keys_per_split, num_splits, H)
        _score_run(*run, n, h0, split, lo, end, 0, PARTIAL, part_row, *out, H, MERGE, PAIR, BALANCED)


@gluon.jit
def _second_run(q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done, n, h0, split, lo, end, k, r,
                partial, part_row, out_ptr, merged_ptr, o_smem, H: gl.constexpr, MERGE: gl.constexpr,
                PAIR: gl.constexpr, BALANCED: gl.constexpr):
    """The second warpgroup's run r (as _score_run's): value columns 256..511 from the scorer's P,
    rescaled by its factors."""
    acc = gl.zeros([64, 256], gl.float32, PV)
    n_tiles = _num_tiles(lo, end)
    for t in range(k, k + n_tiles):
        mbarrier.wait(p_ready, t & 1)
        acc = acc * alpha_smem.load(gl.SliceLayout(1, PV))[:, None]
        acc = warpgroup_mma(p_smem, k_lat.index(t % 2).slice(256, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        barrier()  # (this warpgroup's barrier) its PV is done with P and the key buffer
        mbarrier.arrive(p_free)
        mbarrier.arrive(free.index(t % 2))
    if PAIR and not BALANCED:
        cta_pair.cluster_sync()
    mbarrier.wait(done, r & 1)
    inv = inv_smem.load(gl.SliceLayout(1, PV))
    if MERGE:
        _keep_share(acc, inv, o_smem, free, n_tiles, out_ptr, n, split, h0, 256, H, MERGE)
    else:
        _store_columns(acc, inv, out_ptr, merged_ptr, part_row, n * H + h0, 256,
                       _stage(q_lat, k_lat, n_tiles, 256, BALANCED), partial)


@gluon.jit
def _second_half(q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done, q_free, topk,
                 keys_per_split, num_splits, tiles_per_unit, total_tiles, out_ptr, merged_ptr, o_smem,
                 H: gl.constexpr, PARTIAL: gl.constexpr, MERGE: gl.constexpr, PAIR: gl.constexpr,
                 BALANCED: gl.constexpr):
    """Warpgroup 1: value columns 256..511 of the program's runs (_second_run)."""
    if PAIR:
        cta_pair.cluster_sync()
    run = (q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done)
    out = (out_ptr, merged_ptr, o_smem)
    if BALANCED:
        first, last, runs = _runs(tiles_per_unit, total_tiles, PAIR)
        g = first
        for r in range(runs):
            n, h0, lo, end, partial, part_row, g_next = _run(g, last, r, topk, tiles_per_unit, total_tiles, H, PAIR)
            _second_run(*run, n, h0, 0, lo, end, g - first, r, partial, part_row, *out, H, MERGE, PAIR, BALANCED)
            g = g_next
            barrier()  # (this warpgroup's barrier) every warp has read 1 / l and its staged output
            mbarrier.arrive(q_free)
        if PAIR:
            cta_pair.cluster_sync()
    else:
        n, h0, split, lo, end, part_row = _split_unit(topk, keys_per_split, num_splits, H)
        _second_run(*run, n, h0, split, lo, end, 0, 0, PARTIAL, part_row, *out, H, MERGE, PAIR, BALANCED)


# ---------------------------------------------------------------- the kernel

@gluon.jit
def _sparse_mla_kernel(
    q_ptr, stride_qn, stride_qh, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
    idx_ptr, stride_idx, topk, out_ptr, lse_ptr, scale_log2, keys_per_split, num_splits,
    count_ptr, merged_ptr, merged_lse_ptr, tiles_per_unit, total_tiles,
    H: gl.constexpr, FP8: gl.constexpr, PARTIAL: gl.constexpr, MERGE: gl.constexpr, num_warps: gl.constexpr,
    PAIR: gl.constexpr = False, READY_AT: gl.constexpr = 0, FREE_PEER_AT: gl.constexpr = 0,
    BALANCED: gl.constexpr = False,
):
    LAT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.bfloat16)
    ROPE: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    gl.static_assert(not BALANCED or MERGE == 0, "a balanced grid merges in sparse_mla")
    q_lat = gl.allocate_shared_memory(gl.bfloat16, [64, 512], LAT)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [64, 64], ROPE)
    k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 512], LAT)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], ROPE)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], ROPE)
    # the scorer's per-row rescale factors (each tile) and 1 / l (at the end), for the second warpgroup
    alpha_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    inv_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # per key buffer, which of its rows hold a valid entry (the gatherer's, for the scorer's mask)
    valid = gl.allocate_shared_memory(gl.int8, [2, 64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=2)  # both MMA warpgroups give a buffer back
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(done, count=1)
    mbarrier.init(q_free, count=1)  # the second warpgroup is done with a run's output: Q's buffer is free
    if PAIR:  # FP8 pairs (_gather_fp8_pair): per key buffer, the peer's word that its buffer is free
        gl.static_assert(FP8 and MERGE == 0 and H % 128 == 0, "pairs are for FP8 pools, 128-head blocks, no meeting")
        free_peer = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(free_peer.index(i), count=1)
    fence_async_shared()
    barrier()  # the barriers are in place for every warp
    # with MERGE, the split's normalized output in float32 over the key buffers once the products
    # are done (_keep_share), as [share, head, column] for MERGE shares; 16-byte pieces swizzled by
    # row, so the MMA layout's stores (eight rows a warp) fall in different banks
    o_smem = reinterpret(k_lat, gl.float32, [max(MERGE, 1), 64, 512 // max(MERGE, 1)],
                         gl.SwizzledSharedLayout(4, 1, 8, [2, 1, 0]))
    # the partitions' arguments written out here: constexprs bound to a name first would reach
    # them as runtime values, and a partition cannot be chosen into a variable
    if FP8:
        # a raw tile lands in the upper half of its key buffer's bytes, its scales beside
        # (half h of buffer b is index 2 b + h of the byte views)
        raw2 = reinterpret(k_lat, gl.float8e4nv, [4, 64, 512], PLAIN)
        raw3 = reinterpret(k_lat, gl.float8e4nv, [4, 64, 4, 128], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        scales = gl.allocate_shared_memory(gl.float32, [64, 4], PLAIN)
        if PAIR:
            # a pair's raw halves: a key buffer's bytes as four [64, 256] pieces, half r's raw bytes
            # in piece 2 r, the first of the two its bf16 columns fill
            raw_half = reinterpret(k_lat, gl.float8e4nv, [8, 64, 256], PLAIN)
            n, h0, split, lo, end, part_row = _split_unit(topk, keys_per_split, num_splits, H)  # (a split grid's)
            gl.warp_specialize([
                (_scorer, (q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem,
                           ready, free, p_ready, p_free, done, q_free, valid, topk, keys_per_split, num_splits,
                           tiles_per_unit, total_tiles, scale_log2, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr,
                           o_smem, H, PARTIAL, MERGE, PAIR, BALANCED)),
                (_second_half, (q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done, q_free, topk,
                                keys_per_split, num_splits, tiles_per_unit, total_tiles, out_ptr, merged_ptr, o_smem,
                                H, PARTIAL, MERGE, PAIR, BALANCED)),
                (_gather_fp8_pair, (k_lat, k_rope, raw_half, scales, valid, ready, free, free_peer, kv_ptr,
                                    kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
                                    idx_ptr + n.to(gl.int64) * stride_idx, lo, end, idx_ptr, stride_idx, topk,
                                    tiles_per_unit, total_tiles, H, BALANCED, READY_AT, FREE_PEER_AT)),
            ], [4, 4], [SECOND_REGS, GATHER_REGS])
        else:
            gl.warp_specialize([
                (_scorer, (q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem,
                           ready, free, p_ready, p_free, done, q_free, valid, topk, keys_per_split, num_splits,
                           tiles_per_unit, total_tiles, scale_log2, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr,
                           o_smem, H, PARTIAL, MERGE, PAIR, BALANCED)),
                (_second_half, (q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done, q_free, topk,
                                keys_per_split, num_splits, tiles_per_unit, total_tiles, out_ptr, merged_ptr, o_smem,
                                H, PARTIAL, MERGE, PAIR, BALANCED)),
                (_gather_fp8, (k_lat, k_rope, raw2, raw3, scales, valid, ready, free, kv_ptr, kv_f32_ptr, kv_bf16_ptr,
                               stride_kv, num_slots, idx_ptr, stride_idx, topk, keys_per_split, num_splits,
                               tiles_per_unit, total_tiles, H, BALANCED)),
            ], [4, 4], [SECOND_REGS, GATHER_REGS])
    else:
        gl.warp_specialize([
            (_scorer, (q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem,
                       ready, free, p_ready, p_free, done, q_free, valid, topk, keys_per_split, num_splits,
                       tiles_per_unit, total_tiles, scale_log2, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr,
                       o_smem, H, PARTIAL, MERGE, PAIR, BALANCED)),
            (_second_half, (q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done, q_free, topk,
                            keys_per_split, num_splits, tiles_per_unit, total_tiles, out_ptr, merged_ptr, o_smem,
                            H, PARTIAL, MERGE, PAIR, BALANCED)),
            (_gather, (k_lat, k_rope, valid, ready, free, kv_ptr, stride_kv, num_slots, idx_ptr, stride_idx, topk,
                       keys_per_split, num_splits, tiles_per_unit, total_tiles, H, BALANCED)),
        ], [4, 4], [SECOND_REGS, GATHER_REGS])
    if MERGE:  # the partitions have joined: all of this split's partials are out
        n, h0, split, lo, end, part_row = _split_unit(topk, keys_per_split, num_splits, H)
        counter = count_ptr + n * (H // 64) + h0 // 64
        _wait_for_the_group(counter, _arrive(counter, MERGE))
        _merge_share(o_smem, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr, n, split, h0, H, MERGE)


@functools.cache
def runs_on(device: torch.device) -> bool:
    """wgmma as used here exists on Hopper (sm_90) only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


# FP8 pools at 128 heads run programs of PAIR_MIN_TILES tiles or more as CTA pairs (_gather_fp8_pair):
# 1.04-1.07x one CTA a head block for unsplit rows of top-k 2048 (32 tiles) at batch 64-128, where
# dequantization bounds it; programs of 1-4 tiles (split rows at batch 1-8) lost 4-10% (H100,
# docs/PERFORMANCE.md, "CTA pairs"). PAIRS False (or a Triton whose builds or launcher the pair
# launch does not know) runs one CTA a head block everywhere.
PAIRS = True
PAIR_MIN_TILES = 32
_pair_barriers: dict = {}  # per build's constexprs, (READY_AT, FREE_PEER_AT)


def _barrier_offsets(ptx: str) -> tuple[int, int]:
    """READY_AT and FREE_PEER_AT from a pair build's PTX: its mbarriers in the kernel's init order
    (ready 0, free 0, ready 1, free 1, p_ready, p_free, done, q_free, free_peer 0, free_peer 1), each
    pair of buffers' 8 bytes apart, as the gatherer addresses them."""
    at = cta_pair.mbarrier_offsets(ptx)
    if len(at) != 10 or at[2] != at[0] + 8 or at[9] != at[8] + 8:
        raise cta_pair.Unavailable(f"unexpected mbarrier offsets {at}")
    return at[0], at[8]


def _launch_pairs(grid: int, args: list, constexprs: dict) -> None:
    """The pair kernel, its mbarrier offsets read from a first build (cached) and checked in the second."""
    key = tuple(sorted(constexprs.items()))
    if key not in _pair_barriers:
        probe = cta_pair.build(_sparse_mla_kernel, grid, args, dict(constexprs, PAIR=True))
        ready_at, free_peer_at = _barrier_offsets(probe.asm["ptx"])
        pair = dict(constexprs, PAIR=True, READY_AT=ready_at, FREE_PEER_AT=free_peer_at)
        if _barrier_offsets(cta_pair.build(_sparse_mla_kernel, grid, args, pair).asm["ptx"]) != (ready_at, free_peer_at):
            raise cta_pair.Unavailable("the pair build moved its mbarriers")
        _pair_barriers[key] = (ready_at, free_peer_at)
    ready_at, free_peer_at = _pair_barriers[key]
    cta_pair.launch(_sparse_mla_kernel, grid, args,
                    dict(constexprs, PAIR=True, READY_AT=ready_at, FREE_PEER_AT=free_peer_at))


def launch(q, views, stride_kv, num_slots, indices, topk, part, part_lse, out, lse, scale_log2, keys_per_split, split,
           fp8, merge: bool) -> bool:
    """Start the kernel on sparse_mla's checked arguments; `part` / `part_lse` as there. With `merge`
    (and a split of MERGES, a grid the SMs hold at once and meeting counters on this stream), the
    splits merge into `out` / `lse` in the kernel: True. Otherwise, or if the driver refuses the
    grid as a cooperative launch, the caller's merge kernel has to: False."""
    n, heads, _ = q.shape
    grid = n * split * (heads // BLOCK_H)
    args = [q, q.stride(0), q.stride(1), *views, stride_kv, num_slots, indices, indices.stride(0), topk, part,
            part_lse, scale_log2, keys_per_split, split]
    constexprs = dict(H=heads, FP8=fp8, PARTIAL=split > 1, num_warps=NUM_WARPS)
    run = functools.partial(_sparse_mla_kernel[(grid,)], *args, **constexprs)
    merge = (merge and split in MERGES and grid <= num_sms(q.device)
             and not grid_barrier.refused(_KERNEL, q.device, grid))
    counters = grid_barrier.counters(q.device, n * heads // BLOCK_H, _KERNEL, "the merge kernel") if merge else None
    if counters is not None:
        try:
            run(counters, out, lse, 0, 0, MERGE=split, launch_cooperative_grid=True)
            return True
        except RuntimeError as exc:
            if not grid_barrier.is_refusal(exc):
                raise
            grid_barrier.refuse(_KERNEL, q.device, grid)
    placeholders = [part, part, part_lse, 0, 0]  # no meeting, no balanced grid
    if PAIRS and fp8 and heads % 128 == 0 and keys_per_split >= PAIR_MIN_TILES * BLOCK_N:
        try:
            _launch_pairs(grid, args + placeholders, dict(constexprs, MERGE=0, BALANCED=False))
            return False
        except cta_pair.Unavailable as exc:
            _no_pairs(heads, exc)
    run(*placeholders, MERGE=0)
    return False


def _no_pairs(heads: int, exc: Exception) -> None:
    global PAIRS
    PAIRS = False
    log.warning("FP8 sparse MLA at %d heads runs one CTA a head block (no CTA pairs with Triton %s): %s", heads,
                triton.__version__, exc)


def balanced_pairs(heads: int, fp8: bool) -> bool:
    """Whether a balanced grid runs as CTA pairs: FP8 pools at 128-head blocks, as the split grid's."""
    return PAIRS and fp8 and heads % 128 == 0


def launch_balanced(q, views, stride_kv, num_slots, indices, topk, part, part_lse, out, lse, scale_log2, fp8,
                    programs: int, pair: bool) -> bool:
    """A balanced grid of `programs` programs (_runs), each an equal share of the tiles of all (row,
    head block) units of 64 heads, or with `pair` of 128 heads, a program then two CTAs of a
    cluster: a unit a program finishes goes to `out` / `lse` in bf16, a run over part of a unit to
    the float32 rows (CTA, 0 | 1) of `part` [CTAs * 2 * 64, 512] / `part_lse` [CTAs * 2 * 64], for
    sparse_mla's balanced merge. False where the pair launch is unavailable (PAIRS is then off):
    nothing ran."""
    n, heads, _ = q.shape
    tiles = triton.cdiv(topk, BLOCK_N)
    args = [q, q.stride(0), q.stride(1), *views, stride_kv, num_slots, indices, indices.stride(0), topk, part, part_lse,
            scale_log2, 0, 1, part, out, lse, tiles, n * heads // (BLOCK_H * (1 + pair)) * tiles]
    constexprs = dict(H=heads, FP8=fp8, PARTIAL=True, MERGE=0, BALANCED=True, num_warps=NUM_WARPS)
    if not pair:
        _sparse_mla_kernel[(programs,)](*args, **constexprs)
        return True
    try:
        _launch_pairs(2 * programs, args, constexprs)
        return True
    except cta_pair.Unavailable as exc:
        _no_pairs(heads, exc)
        return False

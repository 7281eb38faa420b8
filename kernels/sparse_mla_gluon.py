"""Sparse MLA on Hopper, in Gluon: three warpgroups with one job each, so that the next key tile is
gathered (and dequantized, from an FP8 pool) while the tensor cores work on this one.

Same contract as kernels/sparse_mla.py, which launches it: one program takes 64 heads of one query
row over its top-k range, 64 keys per tile. Shared memory holds Q, two bf16 key buffers and P
(~226 KB), so one program runs per SM. This module holds the MMA warpgroups, the kernel and its
launch; beside it sparse_mla_gluon_tiles (their work on a tile and on a run's output),
sparse_mla_gluon_gather (the gatherers), sparse_mla_gluon_schedule (which tiles a program takes)
and sparse_mla_gluon_meet (split programs merging where they meet). The warpgroups
(gl.warp_specialize):

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
(tile.store_columns, tile.staging_buffer).

At 128 heads over an FP8 pool the dequantization bounds the kernel, and a row's two head blocks each
dequantized every tile. Unsplit rows (batch 45-66, and the whole waves from 66 on, at top-k 2048)
run them as a CTA pair, one thread-block cluster (kernels/cta_pair.py): each copies and dequantizes
half of every tile's value columns and pushes them into the other's key buffer (gather_fp8_pair),
bit for bit the one-CTA kernel's output, 1.04-1.06x faster (H100, docs/PERFORMANCE.md, "CTA pairs").
A balanced grid's programs are pairs too (its units then 128 heads, a CTA a half), 1.01-1.08x one
CTA a program.

A split top-k range leaves float32 partials. At two or four splits in one wave (MERGES;
sparse_mla.mla_config's at batch 9-16 and 23-33 of 128 heads), where the launch is cooperative
(all of a grid's programs resident at once), the splits of a (row, head block) meet at a counter
in global memory (kernels/grid_barrier.py) and each merges a 1 / MERGE share of the value columns
(meet.merge_share): its own part of that share stays in shared memory, over the key buffers
(meet.keep_share), and only the others' parts go through L2. That halves the partials written and
read at two splits and saves the merge launch (H100: 1.05-1.09x the op at batch 16-32,
docs/PERFORMANCE.md, "The splits merged where they meet"). Otherwise sparse_mla's merge kernel
merges them, one launch later.

A grid of whole or split units leaves SMs idle in its last wave. A balanced grid (BALANCED,
launch_balanced; mla_config's at batch 34-41 of 128 heads, and for the rows past whole waves of
unsplit programs where they fill half a wave or less: 67-99, 133-165... of 128 heads) has one
program an SM (a CTA pair two), each taking an equal share of all units' tiles
(schedule.balanced_share), unit after unit, head block by head block (schedule.balanced_unit), as
runs of one unit each (schedule.balanced_run). The warpgroups loop over the runs with their tile
and mbarrier phase counts carried through; the gatherer walks the tiles without knowing where a
run ends (schedule.next_tile). A run over a whole unit writes bf16 output, bit for bit the unsplit
grid's; a program's first and last runs, where they cover part of a unit, write float32 partials,
which sparse_mla's balanced merge joins (1.03-1.35x the split grid at those batches on the H100,
docs/PERFORMANCE.md, "A balanced grid for the batches between waves").
"""

from __future__ import annotations

import functools
import logging

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)

from . import cta_pair, grid_barrier
from . import sparse_mla_gluon_meet as meet
from . import sparse_mla_gluon_schedule as schedule
from . import sparse_mla_gluon_tiles as tile
from .device import num_sms
from .gluon_compat import barrier, reinterpret
from .sparse_mla_gluon_gather import gather_bf16, gather_fp8, gather_fp8_pair

BLOCK_H = 64  # heads per program: the wgmma M dimension
BLOCK_N = 64  # keys per tile
NUM_WARPS = 4  # the scorer's warpgroup; the other two come on top
# Registers per thread of the partitions; the scorer gets 192. From ptxas 12.8 for sm_90a: with
# the second warpgroup under 160 it ignores setmaxnreg (C7507), and with the gatherer at 160 too
# (the three at the full 512) it serializes the scorer's wgmma chain (C7512: 50% slower on the H200).
SECOND_REGS = gl.constexpr(160)
GATHER_REGS = gl.constexpr(152)


# the split counts that merge where they meet: from 8 splits (batch 8 and below at 128 heads) the
# merge kernel, whose reads spread over every SM, is as fast or faster (H100, docs/PERFORMANCE.md)
MERGES = (2, 4)
_KERNEL = "the Gluon sparse MLA kernel's merge"
log = logging.getLogger(__name__)


@gluon.jit
def _score_run(q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem, ready, free,
               p_ready, p_free, done, valid, n, h0, split, lo, end, k, partial, part_row, scale_log2, out_ptr, lse_ptr,
               merged_ptr, merged_lse_ptr, o_smem, H: gl.constexpr, MERGE: gl.constexpr, PAIR: gl.constexpr,
               BALANCED: gl.constexpr):
    """The scorer's run over top-k entries lo .. end of row n, heads h0 .. h0 + 63, the program's
    tiles k onwards: Q into shared memory, QK of each whole tile, the online softmax, P for the
    second warpgroup, and value columns 0..255."""
    q_row = (q_ptr + n.to(gl.int64) * stride_qn
             + (h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, tile.ROPE_ROWS)))[:, None] * stride_qh)
    col = gl.arange(0, 64, layout=gl.SliceLayout(0, tile.ROPE_ROWS))[None, :]
    for c in gl.static_range(0, 512, 64):  # 64 columns at a time: 16 registers a thread
        q_lat.slice(c, 64, dim=1).store(gl.load(q_row + c + col))
    q_rope.store(gl.load(q_row + 512 + col))
    fence_async_shared()
    barrier()  # (this warpgroup's barrier) all of Q is in place for its wgmma
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, tile.QK))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, tile.QK))
    acc = gl.zeros([64, 256], gl.float32, tile.PV)
    s_zero = gl.zeros([64, 64], gl.float32, tile.QK)
    n_tiles = tile.num_tiles(lo, end)
    for t in range(k, k + n_tiles):
        b = t % 2
        mbarrier.wait(ready.index(b), (t // 2) & 1)
        s = tile.qk(q_lat, q_rope, k_lat.index(b), k_rope.index(b), s_zero)
        ok = valid.index(b).load(gl.SliceLayout(0, tile.QK)) != 0  # under the QK
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = tile.online_softmax(s, ok, scale_log2, m_i, l_i)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, tile.PV), assert_trivial=True)[:, None]
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
    inv = tile.inverse_sum(l_i)
    inv_smem.store(inv)
    barrier()  # (this warpgroup's barrier) 1 / l is in place for the second warpgroup
    mbarrier.arrive(done)
    if MERGE:
        meet.keep_share(acc, inv, o_smem, free, n_tiles, out_ptr, n, split, h0, 0, H, MERGE)
    else:
        tile.store_columns(acc, inv, out_ptr, merged_ptr, part_row, n * H + h0, 0,
                           tile.staging_buffer(q_lat, k_lat, n_tiles, 0, BALANCED), partial)
    tile.store_lse(m_i, l_i, lse_ptr, merged_lse_ptr, part_row, n * H + h0, partial, gl.SliceLayout(1, tile.QK))


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
        first, last, runs = schedule.balanced_share(tiles_per_unit, total_tiles, PAIR)
        g = first
        for r in range(runs):
            n, h0, lo, end, partial, part_row, g_next = schedule.balanced_run(g, last, r, topk, tiles_per_unit,
                                                                              total_tiles, H, PAIR)
            if r > 0:
                mbarrier.wait(q_free, (r - 1) & 1)
                barrier()  # (this warpgroup's barrier) its own warps are done with the staged output too
            _score_run(*run, n, h0, 0, lo, end, g - first, partial, part_row, *out, H, MERGE, PAIR, BALANCED)
            g = g_next
        if PAIR:
            cta_pair.cluster_sync()  # the peer's last arrivals on this CTA's mbarriers are in
    else:
        n, h0, split, lo, end, part_row = schedule.split_unit(topk, keys_per_split, num_splits, H)
        _score_run(*run, n, h0, split, lo, end, 0, PARTIAL, part_row, *out, H, MERGE, PAIR, BALANCED)


@gluon.jit
def _second_run(q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done, n, h0, split, lo, end, k, r,
                partial, part_row, out_ptr, merged_ptr, o_smem, H: gl.constexpr, MERGE: gl.constexpr,
                PAIR: gl.constexpr, BALANCED: gl.constexpr):
    """The second warpgroup's run r (as _score_run's): value columns 256..511 from the scorer's P,
    rescaled by its factors."""
    acc = gl.zeros([64, 256], gl.float32, tile.PV)
    n_tiles = tile.num_tiles(lo, end)
    for t in range(k, k + n_tiles):
        mbarrier.wait(p_ready, t & 1)
        acc = acc * alpha_smem.load(gl.SliceLayout(1, tile.PV))[:, None]
        acc = warpgroup_mma(p_smem, k_lat.index(t % 2).slice(256, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        barrier()  # (this warpgroup's barrier) its PV is done with P and the key buffer
        mbarrier.arrive(p_free)
        mbarrier.arrive(free.index(t % 2))
    if PAIR and not BALANCED:
        cta_pair.cluster_sync()
    mbarrier.wait(done, r & 1)
    inv = inv_smem.load(gl.SliceLayout(1, tile.PV))
    if MERGE:
        meet.keep_share(acc, inv, o_smem, free, n_tiles, out_ptr, n, split, h0, 256, H, MERGE)
    else:
        tile.store_columns(acc, inv, out_ptr, merged_ptr, part_row, n * H + h0, 256,
                           tile.staging_buffer(q_lat, k_lat, n_tiles, 256, BALANCED), partial)


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
        first, last, runs = schedule.balanced_share(tiles_per_unit, total_tiles, PAIR)
        g = first
        for r in range(runs):
            n, h0, lo, end, partial, part_row, g_next = schedule.balanced_run(g, last, r, topk, tiles_per_unit,
                                                                              total_tiles, H, PAIR)
            _second_run(*run, n, h0, 0, lo, end, g - first, r, partial, part_row, *out, H, MERGE, PAIR, BALANCED)
            g = g_next
            barrier()  # (this warpgroup's barrier) every warp has read 1 / l and its staged output
            mbarrier.arrive(q_free)
        if PAIR:
            cta_pair.cluster_sync()
    else:
        n, h0, split, lo, end, part_row = schedule.split_unit(topk, keys_per_split, num_splits, H)
        _second_run(*run, n, h0, split, lo, end, 0, 0, PARTIAL, part_row, *out, H, MERGE, PAIR, BALANCED)


# ---------------------------------------------------------------- the kernel

@gluon.jit(do_not_specialize=["num_splits"])  # kernels/specialization.py
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
    if PAIR:  # FP8 pairs (gather_fp8_pair): per key buffer, the peer's word that its buffer is free
        gl.static_assert(FP8 and MERGE == 0 and H % 128 == 0, "pairs are for FP8 pools, 128-head blocks, no meeting")
        free_peer = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(free_peer.index(i), count=1)
    fence_async_shared()
    barrier()  # the barriers are in place for every warp
    # with MERGE, the split's normalized output in float32 over the key buffers once the products
    # are done (meet.keep_share), as [share, head, column] for MERGE shares; 16-byte pieces swizzled by
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
            # (a split grid's row and range, for the pair's gatherer)
            n, h0, split, lo, end, part_row = schedule.split_unit(topk, keys_per_split, num_splits, H)
            gl.warp_specialize([
                (_scorer, (q_ptr, stride_qn, stride_qh, q_lat, q_rope, k_lat, k_rope, p_smem, alpha_smem, inv_smem,
                           ready, free, p_ready, p_free, done, q_free, valid, topk, keys_per_split, num_splits,
                           tiles_per_unit, total_tiles, scale_log2, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr,
                           o_smem, H, PARTIAL, MERGE, PAIR, BALANCED)),
                (_second_half, (q_lat, k_lat, p_smem, alpha_smem, inv_smem, free, p_ready, p_free, done, q_free, topk,
                                keys_per_split, num_splits, tiles_per_unit, total_tiles, out_ptr, merged_ptr, o_smem,
                                H, PARTIAL, MERGE, PAIR, BALANCED)),
                (gather_fp8_pair, (k_lat, k_rope, raw_half, scales, valid, ready, free, free_peer, kv_ptr,
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
                (gather_fp8, (k_lat, k_rope, raw2, raw3, scales, valid, ready, free, kv_ptr, kv_f32_ptr, kv_bf16_ptr,
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
            (gather_bf16, (k_lat, k_rope, valid, ready, free, kv_ptr, stride_kv, num_slots, idx_ptr, stride_idx, topk,
                           keys_per_split, num_splits, tiles_per_unit, total_tiles, H, BALANCED)),
        ], [4, 4], [SECOND_REGS, GATHER_REGS])
    if MERGE:  # the partitions have joined: all of this split's partials are out
        n, h0, split, lo, end, part_row = schedule.split_unit(topk, keys_per_split, num_splits, H)
        counter = count_ptr + n * (H // 64) + h0 // 64
        meet.wait_for_the_group(counter, meet.arrive(counter, MERGE))
        meet.merge_share(o_smem, out_ptr, lse_ptr, merged_ptr, merged_lse_ptr, n, split, h0, H, MERGE)


@functools.cache
def runs_on(device: torch.device) -> bool:
    """wgmma as used here exists on Hopper (sm_90) only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


# FP8 pools at 128 heads run programs of PAIR_MIN_TILES tiles or more as CTA pairs (gather_fp8_pair):
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
    """A balanced grid of `programs` programs (schedule.balanced_share), each an equal share of the tiles of all (row,
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


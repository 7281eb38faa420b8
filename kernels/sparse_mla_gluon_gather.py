"""The gatherers of the Gluon sparse MLA kernel (kernels/sparse_mla_gluon.py), its third warpgroup: a
program's key tiles by cp.async into two shared key buffers, each row's validity beside them, and
for an FP8 pool the raw rows rewritten in place as bf16 before the MMA warpgroups hear of a tile; at
128 heads over FP8, a CTA pair's gatherers each dequantize half of every tile and push it to the
other CTA (kernels/cta_pair.py)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from dsa_backend.cache.layout import MLA_FP8_BYTES as _MLA_FP8_BYTES

from . import cta_pair
from . import sparse_mla_gluon_schedule as schedule
from . import sparse_mla_gluon_tiles as tile
from .gluon_compat import barrier, cp_async

MLA_FP8_BYTES = gl.constexpr(_MLA_FP8_BYTES)
RAW = gl.constexpr(gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0]))  # e4m3 rows: a warp per row, 16 bytes a thread
SCALES = gl.constexpr(gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]))  # a row's four fp32 scales to one thread
# Raw e4m3 rows [rows, 4, 128] read back for dequantization, 16 bytes a thread: a warp's lanes take
# 128 columns of four rows, so that neither the raw loads nor the swizzled bf16 stores conflict (a
# warp over one whole row puts eight lanes' stores in each bank group).
DEQUANT = gl.constexpr(gl.BlockedLayout([1, 1, 16], [4, 1, 8], [4, 1, 1], [2, 1, 0]))
# A pair's raw rows (256 e4m3 bytes, half a row), and a [64, 64] block of them for dequantization.
RAW_HALF = gl.constexpr(gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0]))
DEQUANT_BLOCK = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))


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
def _valid(idx, num_slots):
    """Which top-k entries name a pool slot (-1 pads, and nothing past the pool counts)."""
    return (idx >= 0) & (idx < num_slots)


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
    return (_entries(idx_row, j0, end, RAW), _entries(idx_row, j0, end, SCALES),
            _entries(idx_row, j0, end, tile.ROPE_ROWS))


@gluon.jit
def _fetch_fp8_tile(buf, entries, k_rope, raw2, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots):
    """Start the cp.async copies of a tile (its _tile_entries) into key buffer buf: the raw latent into
    the buffer's upper half, its scales, and the rope dims. One commit group."""
    lat_idx, scale_idx, rope_idx = entries
    _copy_rows(raw2.index(2 * buf + 1), kv_ptr, lat_idx, num_slots, stride_kv, 0, RAW)
    _copy_rows(scales, kv_f32_ptr, scale_idx, num_slots, MLA_FP8_BYTES // 4, 128, SCALES)
    # a constant row stride, so cp.async sees 16-byte aligned rows
    _copy_rows(k_rope.index(buf), kv_bf16_ptr, rope_idx, num_slots, MLA_FP8_BYTES // 2, 264, tile.ROPE_ROWS)
    async_copy.commit_group()


@gluon.jit
def gather_bf16(k_lat, k_rope, valid, ready, free, kv_ptr, stride_kv, num_slots, idx_ptr, stride_idx, topk,
                keys_per_split, num_splits, tiles_per_unit, total_tiles, H: gl.constexpr, BALANCED: gl.constexpr):
    """The gatherer: the program's tile t (counting through its runs) copied by cp.async into buffer
    t % 2 once both MMA warpgroups are done with tile t - 2, from entries loaded a tile earlier;
    and which of its rows are valid, into valid[t % 2], so that the scorer's mask costs no global
    load."""
    n, j0, n_tiles, end, unit_end, rows = schedule.program_tiles(idx_ptr, stride_idx, topk, keys_per_split, num_splits,
                                                                 tiles_per_unit, total_tiles, H, BALANCED, False)
    lat_idx = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, end, tile.LATENT)
    rope_idx = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, end, tile.ROPE_ROWS)
    for t in range(n_tiles):
        b = t % 2
        n, j0, j_end = schedule.next_tile(n, j0, t, n_tiles, end, unit_end, rows, BALANCED)
        lat_next = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, j_end, tile.LATENT)
        rope_next = _entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, j_end, tile.ROPE_ROWS)
        if t >= 2:
            mbarrier.wait(free.index(b), (t // 2 - 1) & 1)
        _copy_rows(k_lat.index(b), kv_ptr, lat_idx, num_slots, stride_kv, 0, tile.LATENT)
        _copy_rows(k_rope.index(b), kv_ptr, rope_idx, num_slots, stride_kv, 512, tile.ROPE_ROWS)
        async_copy.commit_group()
        valid.index(b).store(_valid(rope_idx, num_slots).to(gl.int8))
        lat_idx = lat_next
        rope_idx = rope_next
        async_copy.wait_group(0)
        fence_async_shared()
        barrier()  # (this warpgroup's barrier) every thread's copies have landed
        mbarrier.arrive(ready.index(b))


@gluon.jit
def gather_fp8(k_lat, k_rope, raw2, raw3, scales, valid, ready, free, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv,
               num_slots, idx_ptr, stride_idx, topk, keys_per_split, num_splits, tiles_per_unit, total_tiles,
               H: gl.constexpr, BALANCED: gl.constexpr):
    """The FP8 gatherer: as gather_bf16, but tile t lands raw in the upper half of buffer t % 2 (its
    scales beside) and is rewritten there as bf16 before the scorer hears of it."""
    tiles = (k_rope, raw2, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots)
    n, j0, n_tiles, end, unit_end, rows = schedule.program_tiles(idx_ptr, stride_idx, topk, keys_per_split, num_splits,
                                                                 tiles_per_unit, total_tiles, H, BALANCED, False)
    entries = _tile_entries(idx_ptr + n.to(gl.int64) * stride_idx, j0, end)
    for t in range(n_tiles):
        b = t % 2
        if t >= 2:
            mbarrier.wait(free.index(b), (t // 2 - 1) & 1)
        _fetch_fp8_tile(b, entries, *tiles)
        valid.index(b).store(_valid(entries[2], num_slots).to(gl.int8))
        n, j0, j_end = schedule.next_tile(n, j0, t, n_tiles, end, unit_end, rows, BALANCED)
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
            _entries(idx_row, j0, end, tile.ROPE_ROWS))


@gluon.jit
def gather_fp8_pair(k_lat, k_rope, raw_half, scales, valid, ready, free, free_peer, kv_ptr, kv_f32_ptr, kv_bf16_ptr,
                    stride_kv, num_slots, idx_row, lo, end, idx_ptr, stride_idx, topk, tiles_per_unit, total_tiles,
                    H: gl.constexpr, BALANCED: gl.constexpr, READY_AT: gl.constexpr, FREE_PEER_AT: gl.constexpr):
    """The FP8 gatherer of a CTA pair (a 128-head row's two head blocks as one cluster): as
    gather_fp8, but each CTA copies and dequantizes half of every tile's value columns and pushes
    them into the peer's buffer, so each dequantizes half as much (the FP8 gatherer bounds the
    one-CTA kernel at 128 heads; docs/PERFORMANCE.md, "Half a tile's gather a CTA").

    The handshake: tile t's ready[b] takes this CTA's arrival and the peer's 32 KB; a CTA's
    gatherer, once its own MMAs are done with buffer b, says so on the peer's free_peer[b], which
    the peer waits on before pushing tile t + 2 there. The gatherer sends it, not the MMA
    warpgroups: from them (two remote arrivals a tile) the pair was 0.80x the one-CTA kernel.

    A split grid's pair walks top-k entries lo .. end of the row at idx_row; a balanced grid's both
    CTAs walk their program's runs (schedule.next_tile)."""
    cta_pair.cluster_sync()  # the peer's mbarriers are initialized
    rank = gl.program_id(0) % 2
    n_tiles = tile.num_tiles(lo, end)
    if BALANCED:
        n, lo, n_tiles, end, unit_end, rows = schedule.program_tiles(idx_ptr, stride_idx, topk, 0, 1, tiles_per_unit,
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
        _copy_rows(k_rope.index(b), kv_bf16_ptr, rope_idx, num_slots, MLA_FP8_BYTES // 2, 264, tile.ROPE_ROWS)
        async_copy.commit_group()
        valid.index(b).store(_valid(rope_idx, num_slots).to(gl.int8))
        if BALANCED:  # a tile ahead, under the copies
            n, lo, j_end = schedule.next_tile(n, lo, t, n_tiles, end, unit_end, rows, True)
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

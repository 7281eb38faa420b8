"""Sparse MLA on Hopper, in Gluon: tile t + 1's rows copy in (cp.async) while tile t is scored,
and an FP8 tile is dequantized while the tensor cores run the PV product before it.

Same contract as kernels/sparse_mla.py, which launches it and shares its split-K merge: one program
takes 64 heads of one query row over its top-k range, 64 keys per tile. Triton's kernel gathers
each tile with loads it then waits for; here each tile is gathered by cp.async into the free one of
two bf16 key buffers during the softmax and PV product of the tile before it, from top-k entries
loaded an iteration earlier (so issuing the copies waits on nothing). An FP8 tile lands raw
(512 e4m3 bytes a row) in the upper half of that buffer, then every warp reads its rows into
registers and writes them back scaled to bf16 over the whole buffer, under the PV product. The two
warpgroups split QK by keys (32 each) and PV by value columns (256 each), as the MMA layouts below
say; P crosses between them through shared memory. Q, two key buffers and P take 224 KB, so one
program runs per SM.

Two schedules share these pieces. Over an FP8 pool the eight warps do everything in one stream
(_single_stream). Over a bf16 pool (prefill, and decode over a bf16 cache) a third warpgroup
gathers (gl.warp_specialize: _producer fills a buffer and signals `ready`, the two MMA warpgroups
in _consumer give it back through `free`), which measured 8-9% faster there; with FP8 the one
producer warpgroup, dequantizing a tile alone, was 3% slower than the single stream
(docs/PERFORMANCE.md).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)

from dsa_backend.cache.layout import MLA_FP8_BYTES as _MLA_FP8_BYTES

from .gluon_compat import barrier, cp_async, reinterpret

MLA_FP8_BYTES = gl.constexpr(_MLA_FP8_BYTES)
BLOCK_H = 64  # heads per program: the wgmma M dimension
BLOCK_N = 64  # keys per tile
NUM_WARPS = 8  # two MMA warpgroups
PRODUCER_REGS = gl.constexpr(112)  # per thread for the gathering warpgroup; the MMA warpgroups get 192


@gluon.jit
def _entries(idx_row, j0, end, LAYOUT: gl.constexpr):
    """Top-k entries j0 .. j0 + 63 along dimension 0 of LAYOUT (-1 past the split's end)."""
    j = j0 + gl.arange(0, 64, layout=gl.SliceLayout(1, LAYOUT))
    return gl.load(idx_row + j, mask=j < end, other=-1)


@gluon.jit
def _copy_rows(dst, src_ptr, idx, num_slots, stride, first: gl.constexpr, LAYOUT: gl.constexpr):
    """cp.async of columns first .. first + width - 1 of the pool rows idx names into dst [64, width];
    src_ptr and stride count dst's elements. Invalid entries (-1, past the slots) land as zeros."""
    ok = (idx >= 0) & (idx < num_slots)
    row = gl.where(ok, idx, 0).to(gl.int64) * stride
    col = first + gl.arange(0, dst.shape[1], layout=gl.SliceLayout(0, LAYOUT))
    cp_async(dst, src_ptr + row[:, None] + col[None, :], mask=ok[:, None])


@gluon.jit
def _dequantize(k_lat, raw, scales, L3: gl.constexpr):
    """Rewrite the raw e4m3 tile in `raw` (which overlaps k_lat) as bf16 rows in k_lat, each 128-wide
    tile times its scale, 32 rows at a time (the PV accumulator holds half the registers)."""
    SL: gl.constexpr = gl.SliceLayout(2, L3)
    lat_a = raw.slice(0, 32).load(L3)
    lat_b = raw.slice(32, 32).load(L3)
    scale_a = scales.slice(0, 32).load(SL)
    scale_b = scales.slice(32, 32).load(SL)
    barrier()  # every warp holds its raw rows before any bf16 row overwrites them
    k_lat.slice(0, 32).store(gl.reshape((lat_a.to(gl.float32) * scale_a[:, :, None]).to(gl.bfloat16), [32, 512]))
    k_lat.slice(32, 32).store(gl.reshape((lat_b.to(gl.float32) * scale_b[:, :, None]).to(gl.bfloat16), [32, 512]))


@gluon.constexpr_function
def _latent_layout(fp8, num_warps):  # a warp per row, 16 bytes a thread
    return gl.BlockedLayout([1, 16 if fp8 else 8], [1, 32], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _scale_layout(num_warps):  # a row's four fp32 scales to one thread
    return gl.BlockedLayout([1, 4], [32, 1], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _rope_layout(num_warps):  # 64 bf16 rope dims a row
    return gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])


@gluon.jit
def _tile_entries(idx_row, j0, end, FP8: gl.constexpr, num_warps: gl.constexpr):
    """Tile j0's top-k entries in the layouts _fetch_tile copies by."""
    return (_entries(idx_row, j0, end, _latent_layout(FP8, num_warps)),
            _entries(idx_row, j0, end, _scale_layout(num_warps)),
            _entries(idx_row, j0, end, _rope_layout(num_warps)))


@gluon.jit
def _fetch_tile(buf, entries, k_lat, k_rope, raw2, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
                FP8: gl.constexpr, num_warps: gl.constexpr):
    """Start the cp.async copies of a tile (its _tile_entries) into key buffer buf: the latent (raw,
    for FP8), its scales and the rope dims. One commit group."""
    lat_idx, scale_idx, rope_idx = entries
    LL: gl.constexpr = _latent_layout(FP8, num_warps)
    LR: gl.constexpr = _rope_layout(num_warps)
    if FP8:
        _copy_rows(raw2.index(2 * buf + 1), kv_ptr, lat_idx, num_slots, stride_kv, 0, LL)
        _copy_rows(scales, kv_f32_ptr, scale_idx, num_slots, MLA_FP8_BYTES // 4, 128, _scale_layout(num_warps))
        # a constant row stride, so cp.async sees 16-byte aligned rows
        _copy_rows(k_rope.index(buf), kv_bf16_ptr, rope_idx, num_slots, MLA_FP8_BYTES // 2, 264, LR)
    else:
        _copy_rows(k_lat.index(buf), kv_ptr, lat_idx, num_slots, stride_kv, 0, LL)
        _copy_rows(k_rope.index(buf), kv_ptr, rope_idx, num_slots, stride_kv, 512, LR)
    async_copy.commit_group()


@gluon.constexpr_function
def _qk_layout():  # QK [64 heads, 64 keys]: each warpgroup 32 keys
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])


@gluon.constexpr_function
def _pv_layout():  # PV [64 heads, 512]: each warpgroup 256 value columns
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])


@gluon.jit
def _qk(q_lat, q_rope, k_lat, k_rope, s_zero):
    """Issue QK of one tile (the 512 latent dims, then the 64 rope dims into the same accumulator)."""
    s = warpgroup_mma(q_lat, k_lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_rope, k_rope.permute((1, 0)), s, is_async=True)


@gluon.jit
def _softmax(s, idx, num_slots, scale_log2, m_i, l_i, acc, p_smem):
    """Online softmax of one QK tile (log2 domain; invalid entries masked): rescales acc, stores P
    for the PV product and returns the new running max and sum."""
    PV: gl.constexpr = _pv_layout()
    ok = (idx >= 0) & (idx < num_slots)
    s = gl.where(ok[None, :], s * scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing valid yet
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, PV), assert_trivial=True)[:, None]
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    return m_new, l_i, acc


@gluon.jit
def _store_output(acc, m_i, l_i, out_ptr, lse_ptr, n, split, num_splits, h0, H: gl.constexpr, PARTIAL: gl.constexpr):
    QK: gl.constexpr = _qk_layout()
    PV: gl.constexpr = _pv_layout()
    has = l_i > 0
    l_safe = gl.where(has, l_i, 1.0)
    inv = gl.convert_layout(gl.where(has, 1.0 / l_safe, 0.0), gl.SliceLayout(1, PV))
    lse = gl.where(has, m_i + gl.log2(l_safe), float("-inf"))  # base 2
    h = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, PV))
    o_row = ((n * num_splits + split) * H + h).to(gl.int64)[:, None] * 512 + gl.arange(0, 512, layout=gl.SliceLayout(0, PV))[None, :]
    hl = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, QK))
    if PARTIAL:  # float32 partials and base-2 lse for sparse_mla's merge kernel
        gl.store(out_ptr + o_row, acc * inv[:, None])
        gl.store(lse_ptr + (n * num_splits + split) * H + hl, lse)
    else:
        gl.store(out_ptr + o_row, (acc * inv[:, None]).to(gl.bfloat16))
        gl.store(lse_ptr + n * H + hl, lse * 0.6931471805599453)


@gluon.jit
def _single_stream(q_lat, q_rope, k_lat, k_rope, p_smem, raw2, raw3, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr,
                   stride_kv, num_slots, idx_row, lo, end, scale_log2, out_ptr, lse_ptr, n, split, num_splits, h0,
                   H: gl.constexpr, FP8: gl.constexpr, PARTIAL: gl.constexpr, num_warps: gl.constexpr):
    """All eight warps in one stream: tile t + 1's copies go out after QK t and land (FP8: and are
    dequantized) under PV t."""
    QK: gl.constexpr = _qk_layout()
    PV: gl.constexpr = _pv_layout()
    # raw e4m3 rows read back for dequantization: a warp per row, 16 bytes a thread
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 4, 8], [num_warps, 1, 1], [2, 1, 0])
    tiles = (k_lat, k_rope, raw2, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots)
    _fetch_tile(0, _tile_entries(idx_row, lo, end, FP8, num_warps), *tiles, FP8, num_warps)
    entries = _tile_entries(idx_row, lo + 64, end, FP8, num_warps)
    async_copy.wait_group(0)
    barrier()
    if FP8:
        _dequantize(k_lat.index(0), raw3.index(1), scales, L3)
    fence_async_shared()
    barrier()

    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, QK))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, QK))
    acc = warpgroup_mma_init(gl.zeros([64, 512], gl.float32, PV))  # loop-carried as an MMA in flight
    s_zero = gl.zeros([64, 64], gl.float32, QK)
    for t in range(gl.cdiv(gl.maximum(end - lo, 0), 64)):
        b = t % 2
        s = _qk(q_lat, q_rope, k_lat.index(b), k_rope.index(b), s_zero)
        j = lo + t * 64 + gl.arange(0, 64, layout=gl.SliceLayout(0, QK))
        idx = gl.load(idx_row + j, mask=j < end, other=-1)  # the mask's entries load under QK t
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))
        barrier()  # both warpgroups are past QK t and PV t - 1: P and the other key buffer are free
        # tile t + 1's copies (entries loaded an iteration ago) run under the softmax and PV t
        _fetch_tile(1 - b, entries, *tiles, FP8, num_warps)
        entries = _tile_entries(idx_row, lo + (t + 2) * 64, end, FP8, num_warps)
        m_i, l_i, acc = _softmax(s, idx, num_slots, scale_log2, m_i, l_i, acc, p_smem)
        barrier()  # all of P is in place
        acc = warpgroup_mma(p_smem, k_lat.index(b), acc, is_async=True)
        async_copy.wait_group(0)
        barrier()  # tile t + 1 has landed, from every warp's copies
        if FP8:  # under PV t
            _dequantize(k_lat.index(1 - b), raw3.index(3 - 2 * b), scales, L3)
        fence_async_shared()
        barrier()  # tile t + 1 is in place for QK t + 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _store_output(acc, m_i, l_i, out_ptr, lse_ptr, n, split, num_splits, h0, H, PARTIAL)


@gluon.jit
def _producer(k_lat, k_rope, raw2, raw3, scales, ready, free, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
              idx_row, lo, end, FP8: gl.constexpr):
    """The gathering warpgroup: tile t into buffer t % 2 once the consumers are done with tile t - 2."""
    PW: gl.constexpr = 4
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 4, 8], [PW, 1, 1], [2, 1, 0])
    tiles = (k_lat, k_rope, raw2, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots)
    entries = _tile_entries(idx_row, lo, end, FP8, PW)
    for t in range(gl.cdiv(gl.maximum(end - lo, 0), 64)):
        b = t % 2
        nxt = _tile_entries(idx_row, lo + (t + 1) * 64, end, FP8, PW)
        if t >= 2:
            mbarrier.wait(free.index(b), (t // 2 - 1) & 1)
        _fetch_tile(b, entries, *tiles, FP8, PW)
        entries = nxt
        async_copy.wait_group(0)
        if FP8:
            barrier()  # every producer warp's copies have landed
            _dequantize(k_lat.index(b), raw3.index(2 * b + 1), scales, L3)
        fence_async_shared()
        barrier()  # (this warpgroup's barrier) the whole tile is written
        mbarrier.arrive(ready.index(b), count=1)  # one thread arrives: the barrier counts 1


@gluon.jit
def _consumer(q_lat, q_rope, k_lat, k_rope, p_smem, ready, free, idx_row, lo, end, num_slots, scale_log2,
              out_ptr, lse_ptr, n, split, num_splits, h0, H: gl.constexpr, PARTIAL: gl.constexpr):
    """The two MMA warpgroups: tile t once `ready`, its buffer handed back after PV t."""
    QK: gl.constexpr = _qk_layout()
    PV: gl.constexpr = _pv_layout()
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, QK))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, QK))
    acc = warpgroup_mma_init(gl.zeros([64, 512], gl.float32, PV))
    s_zero = gl.zeros([64, 64], gl.float32, QK)
    for t in range(gl.cdiv(gl.maximum(end - lo, 0), 64)):
        b = t % 2
        j = lo + t * 64 + gl.arange(0, 64, layout=gl.SliceLayout(0, QK))
        idx = gl.load(idx_row + j, mask=j < end, other=-1)
        mbarrier.wait(ready.index(b), (t // 2) & 1)
        s = _qk(q_lat, q_rope, k_lat.index(b), k_rope.index(b), s_zero)
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))
        barrier()  # (these two warpgroups' barrier) both are past QK t and PV t - 1
        if t >= 1:
            mbarrier.arrive(free.index(1 - b), count=1)  # tile t - 1's buffer back to the producer
        m_i, l_i, acc = _softmax(s, idx, num_slots, scale_log2, m_i, l_i, acc, p_smem)
        barrier()  # all of P is in place
        acc = warpgroup_mma(p_smem, k_lat.index(b), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _store_output(acc, m_i, l_i, out_ptr, lse_ptr, n, split, num_splits, h0, H, PARTIAL)


@gluon.jit
def _sparse_mla_kernel(
    q_ptr, stride_qn, stride_qh, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
    idx_ptr, stride_idx, topk, out_ptr, lse_ptr, scale_log2, keys_per_split, num_splits,
    H: gl.constexpr, FP8: gl.constexpr, PARTIAL: gl.constexpr, WARP_SPECIALIZE: gl.constexpr,
    num_warps: gl.constexpr,
):
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    LAT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.bfloat16)
    ROPE: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    pid = gl.program_id(0)
    h0 = (pid % (H // 64)) * 64
    split = pid // (H // 64) % num_splits
    n = pid // (H // 64) // num_splits
    lo = split * keys_per_split
    end = gl.minimum(lo + keys_per_split, topk)
    idx_row = idx_ptr + n.to(gl.int64) * stride_idx

    hq = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, QL))
    q_row = q_ptr + n.to(gl.int64) * stride_qn + hq[:, None] * stride_qh
    q_lat = gl.allocate_shared_memory(gl.bfloat16, [64, 512], LAT,
                                      gl.load(q_row + gl.arange(0, 512, layout=gl.SliceLayout(0, QL))[None, :]))
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [64, 64], ROPE,
                                       gl.load(q_row + 512 + gl.arange(0, 64, layout=gl.SliceLayout(0, QL))[None, :]))
    k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 512], LAT)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], ROPE)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], ROPE)
    # FP8: a raw tile lands in the upper half of its key buffer's bytes, its scales beside
    # (half h of buffer b is index 2 b + h of the byte views)
    raw2 = reinterpret(k_lat, gl.float8e4nv, [4, 64, 512], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    raw3 = reinterpret(k_lat, gl.float8e4nv, [4, 64, 4, 128], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    scales = gl.allocate_shared_memory(gl.float32, [64, 4], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    if WARP_SPECIALIZE:
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(free.index(i), count=1)
        fence_async_shared()
        barrier()
        gl.warp_specialize([
            (_consumer, (q_lat, q_rope, k_lat, k_rope, p_smem, ready, free, idx_row, lo, end, num_slots, scale_log2,
                         out_ptr, lse_ptr, n, split, num_splits, h0, H, PARTIAL)),
            (_producer, (k_lat, k_rope, raw2, raw3, scales, ready, free, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv,
                         num_slots, idx_row, lo, end, FP8)),
        ], [4], [PRODUCER_REGS])
    else:
        _single_stream(q_lat, q_rope, k_lat, k_rope, p_smem, raw2, raw3, scales, kv_ptr, kv_f32_ptr, kv_bf16_ptr,
                       stride_kv, num_slots, idx_row, lo, end, scale_log2, out_ptr, lse_ptr, n, split, num_splits, h0,
                       H, FP8, PARTIAL, num_warps)


@functools.cache
def runs_on(device: torch.device) -> bool:
    """wgmma as used here exists on Hopper (sm_90) only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def launch(q, views, stride_kv, num_slots, indices, topk, part, part_lse, scale_log2, keys_per_split, split, fp8):
    """Start the kernel on sparse_mla's checked arguments; `part` / `part_lse` as there."""
    n, heads, _ = q.shape
    _sparse_mla_kernel[(n * split * (heads // BLOCK_H),)](
        q, q.stride(0), q.stride(1), *views, stride_kv, num_slots, indices, indices.stride(0), topk,
        part, part_lse, scale_log2, keys_per_split, split,
        H=heads, FP8=fp8, PARTIAL=split > 1, WARP_SPECIALIZE=not fp8, num_warps=NUM_WARPS,
    )

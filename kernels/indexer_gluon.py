"""Paged indexer logits for decode (next_n = 1) on Hopper, in Gluon: the MMA of key tile t runs
while the program scores tile t - 1.

Same contract and output as kernels/indexer_logits.py's paged kernel, bit for bit. Triton issues
each tile's `wgmma` and waits on it at once; here the program issues tile t's MMA, then waits
only for tile t - 1's (`warpgroup_mma_wait(num_outstanding=1)`) and runs its relu / weight / head
sum under the running MMA. Each 64-key tile (inside one page, so page_size % 64 == 0) arrives
with its 64 scales by two TMA copies on one mbarrier, STAGES tiles ahead; the page id of the next
tile to issue is loaded an iteration before it is needed. The tile loop is unrolled: rolled, ptxas
serialized the wgmma pipeline (C7514: an accumulator read while an MMA is in flight, across the
loop's back edge), so the MMA did not in fact run under the scoring. With next_n 2 and 4 the rolled
structure measured no faster than the Triton kernel (docs/PERFORMANCE.md), so it serves next_n 1
only.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from dsa_backend.cache.layout import INDEX_HEAD_DIM

from .gluon_compat import barrier, tma_load

BLOCK_K = 64  # keys per tile: one wgmma M block, and the TMA box inside a page
D = gl.constexpr(INDEX_HEAD_DIM)


@gluon.jit
def _issue_tile(keys, scales, bars, k_smem, sc_smem, page, first, stage, PAGE: gl.constexpr):
    mbarrier.expect(bars.index(stage), keys.block_type.nbytes + scales.block_type.nbytes)
    tma_load(keys, [page, first % PAGE, 0], bars.index(stage), k_smem.index(stage))
    tma_load(scales, [page, first % PAGE], bars.index(stage), sc_smem.index(stage))


@gluon.jit
def _score_tile(acc, w, sc, first, length, out_row, limit, BLOCK: gl.constexpr, OUT: gl.constexpr):
    """acc [BLOCK, H] = keys . q per head -> logits of keys first .. first + BLOCK - 1, stored."""
    y = gl.convert_layout(gl.sum(gl.maximum(acc, 0.0) * w[None, :], axis=1), OUT) * sc
    pos = first + gl.arange(0, BLOCK, layout=OUT)
    gl.store(out_row + pos, gl.where(pos < length, y, float("-inf")), mask=pos < limit)


@gluon.jit
def _paged_logits_kernel(
    q_ptr, w_ptr, keys, scales, bt_ptr, stride_bt, lens_ptr, out_ptr, stride_out, max_len,
    H: gl.constexpr, PAGE: gl.constexpr, BLOCK: gl.constexpr, KEYS_PER_PROG: gl.constexpr, STAGES: gl.constexpr,
    CLEAN: gl.constexpr, num_warps: gl.constexpr,
):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, H, 32])
    OUT: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    QL: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    N_TILES: gl.constexpr = KEYS_PER_PROG // BLOCK
    tok = gl.program_id(0)
    start = gl.program_id(1) * KEYS_PER_PROG
    length = gl.load(lens_ptr + tok)
    out_row = out_ptr + tok.to(gl.int64) * stride_out
    limit = max_len if CLEAN else gl.minimum(length, max_len)  # never past the row, whatever the length
    if start < length:
        h = gl.arange(0, H, layout=gl.SliceLayout(1, QL))
        d = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
        q = gl.load(q_ptr + (tok.to(gl.int64) * H + h)[:, None] * D + d[None, :])
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([H, D], gl.float8e4nv)
        q_smem = gl.allocate_shared_memory(gl.float8e4nv, [H, D], q_layout, q)
        w = gl.load(w_ptr + tok.to(gl.int64) * H + gl.arange(0, H, layout=gl.SliceLayout(0, MMA)))
        k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 1, BLOCK, D], keys.layout)
        sc_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK], scales.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        barrier()  # q and the barriers are in place for every warp before the first MMA / TMA
        bt_row = bt_ptr + tok.to(gl.int64) * stride_bt
        # Tile i lives in stage i % STAGES. The first STAGES tiles are issued now; later ones once
        # the MMA of the tile before them in their stage is done. Tiles past the request's keys
        # read page 0 and are masked at the store.
        for i in gl.static_range(STAGES):
            if i < N_TILES:
                f = start + i * BLOCK
                _issue_tile(keys, scales, bars, k_smem, sc_smem, gl.load(bt_row + f // PAGE, mask=f < length, other=0),
                            f, i, PAGE)
        f_next = start + STAGES * BLOCK
        page_next = gl.load(bt_row + f_next // PAGE, mask=f_next < length, other=0)
        q_t = q_smem.permute((1, 0))
        zero = gl.zeros([BLOCK, H], gl.float32, MMA)
        mbarrier.wait(bars.index(0), 0)
        acc = warpgroup_mma(k_smem.index(0).reshape([BLOCK, D]), q_t, zero, use_acc=False, is_async=True)
        for t in gl.static_range(1, N_TILES):  # unrolled: see the module docstring
            stage = t % STAGES
            mbarrier.wait(bars.index(stage), (t // STAGES) & 1)
            running = warpgroup_mma(k_smem.index(stage).reshape([BLOCK, D]), q_t, zero, use_acc=False, is_async=True)
            done = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            prev = (t - 1) % STAGES
            sc = sc_smem.index(prev).reshape([BLOCK]).load(OUT)
            _score_tile(done, w, sc, start + (t - 1) * BLOCK, length, out_row, limit, BLOCK, OUT)
            barrier()  # every warp is past tile t - 1's MMA and scales: its stage can be refilled
            if t - 1 + STAGES < N_TILES:
                _issue_tile(keys, scales, bars, k_smem, sc_smem, page_next, f_next, prev, PAGE)
                f_next += BLOCK
                page_next = gl.load(bt_row + f_next // PAGE, mask=f_next < length, other=0)
            acc = running
        done = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        sc = sc_smem.index((N_TILES - 1) % STAGES).reshape([BLOCK]).load(OUT)
        _score_tile(done, w, sc, start + (N_TILES - 1) * BLOCK, length, out_row, limit, BLOCK, OUT)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
    elif CLEAN:
        for k0 in range(0, KEYS_PER_PROG, BLOCK):
            pos = start + k0 + gl.arange(0, BLOCK, layout=OUT)
            gl.store(out_row + pos, gl.full([BLOCK], float("-inf"), gl.float32, OUT), mask=pos < max_len)


@functools.cache
def runs_on(device: torch.device) -> bool:
    """wgmma and TMA as used here exist on Hopper (sm_90) only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def gluon_config(batch: int, max_context_len: int, num_sms: int) -> dict | None:
    """Key chunk per program and pipeline depth, or None where the Triton kernel is faster.

    From the H200 measurements in docs/PERFORMANCE.md (next_n 1, CUDA graphs): four stages; four
    programs fit an SM (106 / 122 registers at 1024 / 2048 keys, 4 warps). One wave of 1024-key
    programs when it fits, else of 2048, else 1024 keys; grids under 256 programs (batch 1, short
    contexts) stay on the Triton kernel."""
    resident = 4 * num_sms

    def programs(kpp):
        return batch * triton.cdiv(max_context_len, kpp)

    kpp = next((k for k in (1024, 2048) if programs(k) <= resident), 1024)
    if programs(kpp) < 256:
        return None
    return dict(KEYS_PER_PROG=kpp, STAGES=4)


def paged_indexer_logits(q_fp8, weights, keys, scales, block_table, context_lens, max_context_len: int,
                         clean_logits: bool, config: dict) -> torch.Tensor:
    """Arguments as kernels/indexer_logits.paged_indexer_logits with next_n = 1, already checked
    there; keys [pages, page_size, 128] and scales [pages, page_size] are its pool_parts views."""
    n, heads, _ = q_fp8.shape
    out = torch.empty(n, max_context_len, device=q_fp8.device, dtype=torch.float32)
    key_tiles = TensorDescriptor.from_tensor(keys, [1, BLOCK_K, INDEX_HEAD_DIM], gl.NVMMASharedLayout.get_default_for(
        [1, BLOCK_K, INDEX_HEAD_DIM], gl.float8e4nv))
    scale_tiles = TensorDescriptor.from_tensor(scales, [1, BLOCK_K],
                                               gl.NVMMASharedLayout.get_default_for([1, BLOCK_K], gl.float32))
    grid = (n, triton.cdiv(max_context_len, config["KEYS_PER_PROG"]))
    _paged_logits_kernel[grid](
        q_fp8, weights, key_tiles, scale_tiles, block_table, block_table.stride(0), context_lens, out, out.stride(0),
        max_context_len, H=heads, PAGE=keys.shape[1], BLOCK=BLOCK_K, CLEAN=clean_logits, num_warps=4, **config,
    )
    return out

"""Experiment: the paged indexer (next_n 2 / 4) warp-specialized as DeepGEMM runs it: one CTA of
four consumer warpgroups, each over its own quarter of the CTA's keys, and one loader warp that
issues every consumer's tile TMAs and reads the block table. Consumers never issue a TMA and
meet nobody but their own warpgroup. Weights are read from shared memory at each use."""

from __future__ import annotations

import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from dsa_backend.cache.layout import INDEX_HEAD_DIM
from dsa_kernels.gluon_compat import barrier, tma_load
from dsa_kernels.indexer_gluon import _logits_eviction, _score

BLOCK_K = 64
D = gl.constexpr(INDEX_HEAD_DIM)
CONSUMERS = 4


@gluon.jit
def _loader(keys, scales, full, empty, k_smem, sc_smem, bt_row, length, start, PAGE: gl.constexpr,
            BLOCK: gl.constexpr, KEYS_PER_PROG: gl.constexpr, STAGES: gl.constexpr):
    """One warp: tile t of every consumer in turn, into that consumer's ring, once it is free."""
    N_TILES: gl.constexpr = KEYS_PER_PROG // BLOCK
    LANES: gl.constexpr = gl.BlockedLayout([1], [32], [LOADER_WARPS], [0])
    c = gl.arange(0, 4, layout=LANES)
    first = start + c * KEYS_PER_PROG  # each consumer's first key
    pages = gl.load(bt_row + first // PAGE, mask=first < length, other=0)
    for t in range(N_TILES):
        f = first + t * BLOCK
        nxt = gl.load(bt_row + (f + BLOCK) // PAGE, mask=f + BLOCK < length, other=0)
        for i in gl.static_range(4):
            s = i * STAGES + t % STAGES
            if t >= STAGES:
                mbarrier.wait(empty.index(s), (t // STAGES - 1) & 1)
            page = gl.sum(gl.where(c == i, pages, 0), axis=0)
            key = start + i * KEYS_PER_PROG + t * BLOCK
            if key < length:
                mbarrier.expect(full.index(s), keys.block_type.nbytes + scales.block_type.nbytes)
                tma_load(keys, [page, key % PAGE, 0], full.index(s), k_smem.index(s))
                tma_load(scales, [page, key % PAGE], full.index(s), sc_smem.index(s))
            else:  # past the request's keys: nothing to read, the consumer masks the tile
                mbarrier.arrive(full.index(s))
        pages = nxt


@gluon.jit
def _consumer(q_smem, w_smem, w_ptr, full, empty, k_smem, sc_smem, lens_ptr, tok, out_rows, stride_out, limit, length,
              start, i: gl.constexpr, H: gl.constexpr, BLOCK: gl.constexpr, KEYS_PER_PROG: gl.constexpr,
              STAGES: gl.constexpr, NEXT_N: gl.constexpr, CLEAN: gl.constexpr, EVICT: gl.constexpr):
    GROUP: gl.constexpr = 2
    GROUPS: gl.constexpr = NEXT_N // GROUP
    N: gl.constexpr = GROUP * H
    N_TILES: gl.constexpr = KEYS_PER_PROG // BLOCK
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    STORE: gl.constexpr = gl.BlockedLayout([1, GROUP], [32, 1], [4, 1], [0, 1])
    SCALES: gl.constexpr = gl.SliceLayout(1, STORE)
    token = gl.arange(0, GROUP, layout=gl.SliceLayout(0, STORE))
    lens0 = gl.load(lens_ptr + tok + token)
    lens1 = gl.load(lens_ptr + tok + (GROUPS - 1) * GROUP + token)
    first = start + i * KEYS_PER_PROG
    zero = gl.zeros([BLOCK, N], gl.float32, MMA)
    col = gl.arange(0, N, layout=gl.SliceLayout(0, MMA))
    if W_IN_REGS:
        w0 = gl.load(w_ptr + tok.to(gl.int64) * H + col)
        w1 = gl.load(w_ptr + tok.to(gl.int64) * H + (GROUPS - 1) * N + col)
    for t in range(N_TILES):
        s = i * STAGES + t % STAGES
        mbarrier.wait(full.index(s), (t // STAGES) & 1)
        sc = sc_smem.index(s).reshape([BLOCK]).load(SCALES)
        for g in gl.static_range(GROUPS):
            done = warpgroup_mma(k_smem.index(s).reshape([BLOCK, D]), q_smem.slice(g * N, N).permute((1, 0)), zero,
                                 use_acc=False)
            if g == GROUPS - 1:
                barrier()  # (this warpgroup's) every warp is past the tile's last MMA and has its scales
                mbarrier.arrive(empty.index(s))
            if W_IN_REGS:
                _score(done, w0, w1, sc, lens0, lens1, g, first + t * BLOCK, out_rows, stride_out, limit, BLOCK, GROUP,
                       H, STORE, EVICT)
            else:
                w = w_smem.slice(g * N, N).load(gl.SliceLayout(0, MMA))
                _score(done, w, w, sc, lens0, lens1, g, first + t * BLOCK, out_rows, stride_out, limit, BLOCK, GROUP,
                       H, STORE, EVICT)


@gluon.jit
def _ws_logits_kernel(
    q_ptr, w_ptr, keys, scales, bt_ptr, stride_bt, lens_ptr, out_ptr, stride_out, max_len,
    H: gl.constexpr, PAGE: gl.constexpr, BLOCK: gl.constexpr, KEYS_PER_PROG: gl.constexpr, STAGES: gl.constexpr,
    NEXT_N: gl.constexpr, CLEAN: gl.constexpr, EVICT: gl.constexpr, num_warps: gl.constexpr,
):
    req = gl.program_id(0)
    start = gl.program_id(1) * (4 * KEYS_PER_PROG)
    tok = req * NEXT_N
    LANES: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    length = gl.max(gl.load(lens_ptr + tok + gl.arange(0, NEXT_N, layout=LANES)), axis=0)
    out_rows = out_ptr + tok.to(gl.int64) * stride_out
    limit = max_len if CLEAN else gl.minimum(length, max_len)
    QL: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    h = gl.arange(0, NEXT_N * H, layout=gl.SliceLayout(1, QL))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
    q = gl.load(q_ptr + (tok.to(gl.int64) * H + h)[:, None] * D + d[None, :])
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [NEXT_N * H, D],
                                       gl.NVMMASharedLayout.get_default_for([NEXT_N * H, D], gl.float8e4nv), q)
    w_smem = gl.allocate_shared_memory(gl.float32, [NEXT_N * H], gl.SwizzledSharedLayout(1, 1, 1, [0]),
                                       gl.load(w_ptr + tok.to(gl.int64) * H + gl.arange(0, NEXT_N * H, layout=LANES)))
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [4 * STAGES, 1, BLOCK, D], keys.layout)
    sc_smem = gl.allocate_shared_memory(gl.float32, [4 * STAGES, 1, BLOCK], scales.layout)
    full = gl.allocate_shared_memory(gl.int64, [4 * STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [4 * STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(4 * STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    barrier()  # q, the weights and the barriers are in place for every warp
    bt_row = bt_ptr + req.to(gl.int64) * stride_bt
    gl.warp_specialize([
        (_consumer, (q_smem, w_smem, w_ptr, full, empty, k_smem, sc_smem, lens_ptr, tok, out_rows, stride_out, limit, length,
                     start, 0, H, BLOCK, KEYS_PER_PROG, STAGES, NEXT_N, CLEAN, EVICT)),
        (_consumer, (q_smem, w_smem, w_ptr, full, empty, k_smem, sc_smem, lens_ptr, tok, out_rows, stride_out, limit, length,
                     start, 1, H, BLOCK, KEYS_PER_PROG, STAGES, NEXT_N, CLEAN, EVICT)),
        (_consumer, (q_smem, w_smem, w_ptr, full, empty, k_smem, sc_smem, lens_ptr, tok, out_rows, stride_out, limit, length,
                     start, 2, H, BLOCK, KEYS_PER_PROG, STAGES, NEXT_N, CLEAN, EVICT)),
        (_consumer, (q_smem, w_smem, w_ptr, full, empty, k_smem, sc_smem, lens_ptr, tok, out_rows, stride_out, limit, length,
                     start, 3, H, BLOCK, KEYS_PER_PROG, STAGES, NEXT_N, CLEAN, EVICT)),
        (_loader, (keys, scales, full, empty, k_smem, sc_smem, bt_row, length, start, PAGE, BLOCK, KEYS_PER_PROG,
                   STAGES)),
    ], [4, 4, 4, LOADER_WARPS], [REGS, REGS, REGS, LOADER_REGS])


REGS = gl.constexpr(int(os.environ.get("WS_REGS", "112")))
LOADER_REGS = gl.constexpr(int(os.environ.get("WS_LOADER_REGS", "24")))
LOADER_WARPS = gl.constexpr(int(os.environ.get("WS_LOADER_WARPS", "4")))
W_IN_REGS = gl.constexpr(os.environ.get("WS_W_IN_REGS", "1") == "1")


def paged_indexer_logits(q_fp8, weights, keys, scales, block_table, context_lens, max_context_len: int, next_n: int,
                         clean_logits: bool, config: dict) -> torch.Tensor:
    """As kernels/indexer_gluon.paged_indexer_logits for next_n 2 / 4 with clean logits; KEYS_PER_PROG
    is each consumer's share, a CTA takes four of them."""
    assert next_n in (2, 4)
    n, heads, _ = q_fp8.shape
    out = torch.empty(n, max_context_len, device=q_fp8.device, dtype=torch.float32)
    key_tiles = TensorDescriptor.from_tensor(keys, [1, BLOCK_K, INDEX_HEAD_DIM], gl.NVMMASharedLayout.get_default_for(
        [1, BLOCK_K, INDEX_HEAD_DIM], gl.float8e4nv))
    scale_tiles = TensorDescriptor.from_tensor(scales, [1, BLOCK_K],
                                               gl.NVMMASharedLayout.get_default_for([1, BLOCK_K], gl.float32))
    kpp = config["KEYS_PER_PROG"]
    grid = (n // next_n, triton.cdiv(max_context_len, 4 * kpp))
    _ws_logits_kernel[grid](
        q_fp8, weights, key_tiles, scale_tiles, block_table, block_table.stride(0), context_lens,
        out, out.stride(0), max_context_len, H=heads, PAGE=keys.shape[1], BLOCK=BLOCK_K, NEXT_N=next_n,
        CLEAN=clean_logits, EVICT=_logits_eviction(out), num_warps=4, KEYS_PER_PROG=kpp, STAGES=config["STAGES"],
    )
    return out

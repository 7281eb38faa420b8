"""Block-scaled FP8 GEMMs for FP8 checkpoints' linear layers and routed experts, weights kept in e4m3.

DeepSeek-V3.2 and GLM-5 release their linear weights in e4m3 with one float32 scale a 128 x 128
block (`weight_scale_inv`). Here the weights stay so, at half the bytes of bf16, which a decode
step reads once each (docs/PERFORMANCE.md, "FP8 weights kept in FP8"). Activations are quantized on the fly in 1 x 128 groups along K, the
groups the weights' blocks cut, so each 128-wide K step is one e4m3 dot scaled by one activation
scale a row and one weight scale a column:

    out[m, n] = sum_kb (a_fp8[m, kb] . w_fp8[n, kb]) * a_scale[m, kb] * w_scale[n // SCALE_N, kb]

One kernel serves a dense layer (one group of rows) and the routed experts (rows sorted by expert,
group g's rows running from starts[g] to ends[g], against weight g): a program takes BM rows of
one group and BN columns. Dense layers whose tiles would not fill the GPU split K over programs
that write float32 partials, summed after (no atomics: a layer's output does not depend on the
split's timing).
The row count changes every step and only bounds a mask, so it is not specialized on
(kernels/specialization.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import batch_invariant
from .cache_store import _round_to_e4m3, _to_bf16
from .device import num_sms
from .host_math import cdiv
from .triton_dot import INTERPRET, dot

BLOCK = 128  # the checkpoints' quantization block: weights 128 x 128, activations 1 x 128


@triton.jit
def _store_quantized(x, rows, k, M, mask, q_ptr, s_ptr, stride_q, stride_s, g):
    """Float32 x [ROWS, 128], one group of each row -> e4m3 values and their float32 scales, bit
    for bit the CPU reference's (amax / 448 and the division IEEE, the rounding by hand as in the
    cache stores; torch on the GPU multiplies by 1 / 448 instead, which may differ in the last bit)."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    v = tl.math.div_rn(x, scale[:, None])
    v = _round_to_e4m3(tl.minimum(tl.maximum(v, -448.0), 448.0)).to(tl.float8e4nv)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_q + k[None, :], v, mask=mask)
    tl.store(s_ptr + rows * stride_s + g, scale, mask=rows < M)


@triton.jit(do_not_specialize=["M"])
def _quantize_groups(x_ptr, q_ptr, s_ptr, M, K, stride_x, stride_q, stride_s, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr):
    """ROWS rows' 128-wide group of x -> e4m3 values and their scales (_store_quantized)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    k = g * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (k[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + k[None, :], mask=mask, other=0.0).to(tl.float32)
    _store_quantized(x, rows, k, M, mask, q_ptr, s_ptr, stride_q, stride_s, g)


@triton.jit
def _in_dtype(x, dtype: tl.constexpr):
    """float32 x rounded to the activations' dtype (ties to even) and back: torch rounds each
    elementwise product of bf16 tensors to bf16."""
    if dtype == tl.bfloat16:
        x = _to_bf16(x).to(tl.float32)
    return x


@triton.jit(do_not_specialize=["M"])
def _silu_mul_quantize(h_ptr, w_ptr, q_ptr, s_ptr, M, I, stride_h, stride_q, stride_s, HAS_WEIGHT: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """silu(gate) * up (times the row's weight) for ROWS rows' 128-wide group -> e4m3 and scales."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    k = g * BLOCK + tl.arange(0, BLOCK)
    mask = (rows[:, None] < M) & (k[None, :] < I)
    gate_at = h_ptr + rows[:, None].to(tl.int64) * stride_h + k[None, :]
    gate = tl.load(gate_at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_at + I, mask=mask, other=0.0).to(tl.float32)
    dtype: tl.constexpr = h_ptr.dtype.element_ty
    act = _in_dtype(_in_dtype(gate / (1.0 + tl.exp(-gate)), dtype) * up, dtype)
    if HAS_WEIGHT:
        act = _in_dtype(act * tl.load(w_ptr + rows, mask=rows < M, other=0.0)[:, None], dtype)
    _store_quantized(act, rows, k, M, mask, q_ptr, s_ptr, stride_q, stride_s, g)


def _quantized(m: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(m, k, dtype=torch.float8_e4m3fn, device=device),
            torch.empty(m, cdiv(k, BLOCK), dtype=torch.float32, device=device))


def quantize_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], scales [M, cdiv(K, 128)] float32), x ~ values * scale a group."""
    m, k = x.shape
    q, s = _quantized(m, k, x.device)
    if m:
        _quantize_groups[(cdiv(m, 16), cdiv(k, BLOCK))](x, q, s, m, k, x.stride(0), q.stride(0), s.stride(0),
                                                       ROWS=16, BLOCK=BLOCK)
    return q, s


def silu_mul_quantize(h: torch.Tensor, row_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h [M, 2I] (gate then up, a stacked GEMM's output) -> quantize_act(silu(gate) * up), times
    row_weight [M] (float32) if given, rounded to h's dtype after each product as torch rounds
    them: one pass where torch takes three products, a cast and the quantization."""
    m, i = h.shape[0], h.shape[1] // 2
    q, s = _quantized(m, i, h.device)
    if m:
        _silu_mul_quantize[(cdiv(m, 16), cdiv(i, BLOCK))](
            h, h if row_weight is None else row_weight, q, s, m, i, h.stride(0), q.stride(0), s.stride(0),
            HAS_WEIGHT=row_weight is not None, ROWS=16, BLOCK=BLOCK)
    return q, s


@triton.jit
def _group_of_tile(tile, starts, ends, tile_ends, num_groups, BM: tl.constexpr, LOG_GROUPS: tl.constexpr):
    """The group whose rows M tile `tile` covers (tiles are laid out group after group), the tile's
    first row and the end of the group's rows; group num_groups for a tile past the last."""
    lo = tile * 0
    hi = lo + num_groups
    for _ in tl.static_range(LOG_GROUPS):
        mid = (lo + hi) // 2
        right = tl.load(tile_ends + mid, mask=mid < num_groups, other=2**30) <= tile
        lo, hi = tl.where(right, mid + 1, lo), tl.where(right, hi, mid)
    first_tile = tl.load(tile_ends + lo - 1, mask=lo > 0, other=0)
    start = tl.load(starts + lo, mask=lo < num_groups, other=0)
    return lo, start + (tile - first_tile) * BM, tl.load(ends + lo, mask=lo < num_groups, other=0)


@triton.jit(do_not_specialize=["M"])
def _fp8_gemm(
    a_ptr, as_ptr, w_ptr, ws_ptr, out_ptr, starts, ends, tile_ends, M, N, K, num_groups,
    stride_am, stride_asm, stride_wg, stride_wn, stride_wsg, stride_wsn, stride_os, stride_om,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SCALE_N: tl.constexpr, SPLIT_K: tl.constexpr,
    GROUPED: tl.constexpr, LOG_GROUPS: tl.constexpr, EXACT: tl.constexpr,
):
    tile, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if GROUPED:
        g, first_row, row_end = _group_of_tile(tile, starts, ends, tile_ends, num_groups, BM, LOG_GROUPS)
        if g >= num_groups:
            return
        rows = first_row + tl.arange(0, BM)
    else:
        g = 0
        rows = tile * BM + tl.arange(0, BM)
        row_end = M
    cols = pid_n * BN + tl.arange(0, BN)
    rmask, cmask = rows < row_end, cols < N
    ks = tl.arange(0, BK)
    a_rows = a_ptr + rows[:, None] * stride_am
    w_cols = w_ptr + g.to(tl.int64) * stride_wg + cols[:, None] * stride_wn
    w_scales = ws_ptr + g * stride_wsg + (cols // SCALE_N) * stride_wsn
    k_blocks = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(split * per_split, tl.minimum((split + 1) * per_split, k_blocks)):
        k = kb * BK + ks
        a = tl.load(a_rows + k[None, :], mask=rmask[:, None] & (k[None, :] < K), other=0.0)
        w = tl.load(w_cols + k[None, :], mask=cmask[:, None] & (k[None, :] < K), other=0.0)
        a_scale = tl.load(as_ptr + rows * stride_asm + kb, mask=rmask, other=0.0)
        w_scale = tl.load(w_scales + kb, mask=cmask, other=0.0)
        acc += dot(a, tl.trans(w), EXACT) * (a_scale[:, None] * w_scale[None, :])
    out = out_ptr + split * stride_os + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def _tiles(m: int) -> tuple[int, int, int]:
    """(BM, BN, warps) for m rows: small M is a weight read, so narrower column tiles make more
    programs; from 64 rows the tiles are the tensor cores' (64 x 128 and up). Under batch-invariant
    mode one tile shape for every m, so that a row's sums do not follow the batch."""
    if batch_invariant.enabled():
        return 64, 128, 4
    if m <= 16:
        return 16, 64, 4
    if m <= 32:
        return 32, 64, 4
    if m <= 64:
        return 64, 128, 4
    return 128, 128, 8


def _scale_n(w: torch.Tensor, w_scale: torch.Tensor) -> int:
    """Weight rows a scale row covers: 128 (the checkpoints' blocks) or 1 (per-row scales, for
    stacked weights whose parts do not end on a block, see dsa_backend.weights)."""
    return 1 if w_scale.shape[-2] == w.shape[-2] and w.shape[-2] > 1 else BLOCK


def _split_k(programs: int, k_blocks: int, sms: int) -> int:
    """Splits of K for a dense GEMM whose tiles fill less than a wave: enough programs for two a
    SM, each still walking at least four K blocks."""
    if programs >= sms:
        return 1
    return max(1, min(2 * sms // programs, k_blocks // 4, 16))


@triton.jit
def _sum_splits(partials, out, size, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """out = the SPLIT_K float32 partials [SPLIT_K, size] summed in order, in out's dtype."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(partials + s * size + i, mask=i < size, other=0.0)
    tl.store(out + i, acc.to(out.dtype.element_ty), mask=i < size)


def launch_config(m: int, n: int, k: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BM, BN, warps, K splits) of a dense GEMM of m rows: each distinct one compiles once
    (dsa_backend/warmup.py compiles them all at start)."""
    bm, bn, warps = _tiles(m)
    if batch_invariant.enabled():
        return bm, bn, warps, 1
    return bm, bn, warps, _split_k(cdiv(m, bm) * cdiv(n, bn), cdiv(k, BLOCK), num_sms(device))


def grouped_tiles(pairs: int, groups: int) -> tuple[int, int, int]:
    """(BM, BN, warps) of a grouped GEMM: the tile of the runs' mean length."""
    return _tiles(max(1, pairs // groups))


def fp8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (bf16 or float32) times w [N, K] e4m3 (w_scale [N/128 or N, K/128]) transposed ->
    [M, N] in x's dtype; x is quantized first (quantize_act). Quantizing inside the GEMM instead,
    each program its rows, took 2-5x longer at every shape measured (H100, 2026-11-28)."""
    return fp8_gemm(*quantize_act(x), w, w_scale, x.dtype)


def fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """a [M, K] e4m3 (a_scale [M, K/128]) times w [N, K] e4m3 (w_scale [N/128 or N, K/128]) transposed."""
    m, k = a.shape
    n = w.shape[0]
    bm, bn, warps, split = launch_config(m, n, k, a.device)
    grid_m, grid_n = cdiv(m, bm), cdiv(n, bn)
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    partials = torch.empty(split, m, n, dtype=torch.float32, device=a.device) if split > 1 else out
    if m:
        _fp8_gemm[(grid_m, grid_n, split)](
            a, a_scale, w, w_scale, partials, a, a, a, m, n, k, 1,
            a.stride(0), a_scale.stride(0), 0, w.stride(0), 0, w_scale.stride(0), m * n, partials.stride(-2),
            BM=bm, BN=bn, BK=BLOCK, SCALE_N=_scale_n(w, w_scale), SPLIT_K=split, GROUPED=False, LOG_GROUPS=1,
            EXACT=INTERPRET, num_warps=warps, num_stages=1 if INTERPRET else 4)
        if split > 1:
            _sum_splits[(cdiv(m * n, 1024),)](partials, out, m * n, SPLIT_K=split, BLOCK=1024)
    return out


def fp8_grouped_linear(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                       ends: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, align: int = 1) -> torch.Tensor:
    """Rows of a [R, K] e4m3 (a_scale [R, K/128]) in runs by group: group g's rows run from
    run_starts(ends, align)[g] to ends[g] (int32, nondecreasing) and meet weight w[g] ([G, N, K]
    e4m3, w_scale [G, N/128 or N, K/128]) -> [R, N]; rows in no run are left unwritten. Reads
    nothing back to the host: the grid holds every tile the runs could need and tiles past the
    last run's return at once."""
    rows, k = a.shape
    groups, n = w.shape[0], w.shape[1]
    bm, bn, warps = grouped_tiles(rows, groups)
    starts = run_starts(ends, align)
    tile_ends = ((ends - starts + bm - 1) // bm).cumsum(0).to(torch.int32)
    out = torch.empty(rows, n, dtype=out_dtype, device=a.device)
    if rows:
        _fp8_gemm[(cdiv(rows, bm) + groups, cdiv(n, bn), 1)](
            a, a_scale, w, w_scale, out, starts, ends, tile_ends, rows, n, k, groups,
            a.stride(0), a_scale.stride(0), w.stride(0), w.stride(1), w_scale.stride(0), w_scale.stride(1),
            0, out.stride(0),
            BM=bm, BN=bn, BK=BLOCK, SCALE_N=_scale_n(w, w_scale), SPLIT_K=1, GROUPED=True,
            LOG_GROUPS=max(1, groups.bit_length()), EXACT=INTERPRET, num_warps=warps,
            num_stages=1 if INTERPRET else 4)
    return out


def run_starts(ends: torch.Tensor, align: int) -> torch.Tensor:
    """Where each group's rows start: the previous group's end rounded up to a multiple of align
    (1: runs back to back; DeepGEMM's M-grouped GEMMs want 128, its "psum" layout)."""
    previous = torch.cat([ends.new_zeros(1), ends[:-1]])
    return (previous + align - 1) // align * align

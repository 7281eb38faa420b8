"""Sparse MLA attention in Triton: absorbed q [N, H, 576] over the top-k rows of the latent cache.

One kernel serves decode (paged pool, bf16 [S, 576] or FP8 [S, 656]) and prefill (a bf16
[Nk, 576] buffer is just a pool): rows are gathered by index, -1 (or >= S) is skipped. The
latent is handled as four 128-wide tiles so an FP8 row needs no dequantized copy: its tile scale
multiplies the [heads, keys] scores (QK) and the probabilities (PV) instead of the values.
When N * H / BLOCK_H programs cannot fill the GPU, the top-k range is split across programs
and a second small kernel merges the partial results by their log-sum-exp (split-K, as FlashMLA
does: one extra launch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsa_backend.cache.layout import KV_LORA_RANK, MLA_FP8_BYTES, ROPE_DIM

from .cache_store import _to_bf16
from .triton_dot import INTERPRET, dot

_LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)  # lse leaves in natural log
_MERGE_D = 128  # value columns per merge program


@triton.jit
def _latent_tile(kv_ptr, kv_f32_ptr, row, ok, T: tl.constexpr, FP8: tl.constexpr):
    """Latent columns [128 T, 128 T + 128) of the gathered rows as bf16, and their FP8 tile scale.

    FP8 row bytes: 512 e4m3 | 4 fp32 tile scales | 64 bf16 rope. The bf16 pool has no scale.
    """
    k = tl.load(kv_ptr + row[:, None] + T * 128 + tl.arange(0, 128)[None, :], mask=ok[:, None], other=0.0)
    scale = ok.to(tl.float32)
    if FP8:
        scale = tl.load(kv_f32_ptr + row // 4 + 128 + T, mask=ok, other=0.0)
    return k.to(tl.bfloat16), scale


@triton.jit
def _rope_tile(kv_ptr, kv_bf16_ptr, row, ok, FP8: tl.constexpr):
    """The gathered rows' 64 bf16 rope dims."""
    dr = tl.arange(0, 64)
    if FP8:
        rope = tl.load(kv_bf16_ptr + row[:, None] // 2 + 264 + dr[None, :], mask=ok[:, None], other=0.0)
    else:
        rope = tl.load(kv_ptr + row[:, None] + 512 + dr[None, :], mask=ok[:, None], other=0.0)
    return rope


@triton.jit
def _scaled(x, scale, FP8: tl.constexpr):
    """[heads, keys] scores or probabilities times each key's FP8 tile scale, instead of dequantizing."""
    if FP8:
        x = x * scale[None, :]
    return x


@triton.jit
def _pv_tile(acc, alpha, p, k, scale, FP8: tl.constexpr, UPCAST: tl.constexpr):
    """acc [heads, 128] rescaled by alpha, plus p @ one latent tile (p carries the FP8 tile scale)."""
    return acc * alpha[:, None] + dot(_scaled(p, scale, FP8).to(tl.bfloat16), k, UPCAST)


@triton.jit
def _sparse_mla_kernel(
    q_ptr, stride_qn, stride_qh, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
    idx_ptr, stride_idx, topk, out_ptr, lse_ptr, scale_log2, keys_per_split, num_splits,
    H: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
    PARTIAL: tl.constexpr, UPCAST: tl.constexpr,
):
    # a flat grid with the head blocks fastest: the programs that gather the same KV rows run side
    # by side, so all but the first read them from L2 (and N is not capped at 65535 as grid y/z are)
    pid = tl.program_id(0)
    h = (pid % (H // BLOCK_H)) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = pid // (H // BLOCK_H) % num_splits
    n = pid // (H // BLOCK_H) // num_splits
    d = tl.arange(0, 128)
    dr = tl.arange(0, 64)
    q_row = q_ptr + n.to(tl.int64) * stride_qn + h[:, None] * stride_qh
    q0 = tl.load(q_row + d[None, :])
    q1 = tl.load(q_row + 128 + d[None, :])
    q2 = tl.load(q_row + 256 + d[None, :])
    q3 = tl.load(q_row + 384 + d[None, :])
    qr = tl.load(q_row + 512 + dr[None, :])
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc0 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc1 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc2 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc3 = tl.zeros((BLOCK_H, 128), tl.float32)
    lo = split * keys_per_split
    for j0 in range(lo, tl.minimum(lo + keys_per_split, topk), BLOCK_N):  # a split past topk does nothing
        j = j0 + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + n.to(tl.int64) * stride_idx + j, mask=j < topk, other=-1)
        ok = (idx >= 0) & (idx < num_slots)
        row = tl.where(ok, idx, 0).to(tl.int64) * stride_kv
        # every load of the tile is issued before the first dot, so their latencies overlap
        kr = _rope_tile(kv_ptr, kv_bf16_ptr, row, ok, FP8)
        k0, s0 = _latent_tile(kv_ptr, kv_f32_ptr, row, ok, 0, FP8)
        k1, s1 = _latent_tile(kv_ptr, kv_f32_ptr, row, ok, 1, FP8)
        k2, s2 = _latent_tile(kv_ptr, kv_f32_ptr, row, ok, 2, FP8)
        k3, s3 = _latent_tile(kv_ptr, kv_f32_ptr, row, ok, 3, FP8)
        qk = dot(qr, tl.trans(kr), UPCAST)
        qk += _scaled(dot(q0, tl.trans(k0), UPCAST), s0, FP8)
        qk += _scaled(dot(q1, tl.trans(k1), UPCAST), s1, FP8)
        qk += _scaled(dot(q2, tl.trans(k2), UPCAST), s2, FP8)
        qk += _scaled(dot(q3, tl.trans(k3), UPCAST), s3, FP8)
        qk = tl.where(ok[None, :], qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing valid yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        acc0 = _pv_tile(acc0, alpha, p, k0, s0, FP8, UPCAST)
        acc1 = _pv_tile(acc1, alpha, p, k1, s1, FP8, UPCAST)
        acc2 = _pv_tile(acc2, alpha, p, k2, s2, FP8, UPCAST)
        acc3 = _pv_tile(acc3, alpha, p, k3, s3, FP8, UPCAST)
    has = l_i > 0
    l_safe = tl.where(has, l_i, 1.0)
    inv = tl.where(has, 1.0 / l_safe, 0.0)
    lse = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))  # base 2
    o_row = ((n * num_splits + split) * H + h).to(tl.int64)[:, None] * 512 + d[None, :]
    if PARTIAL:  # float32 partials and base-2 lse for _merge_splits_kernel
        tl.store(out_ptr + o_row, acc0 * inv[:, None])
        tl.store(out_ptr + o_row + 128, acc1 * inv[:, None])
        tl.store(out_ptr + o_row + 256, acc2 * inv[:, None])
        tl.store(out_ptr + o_row + 384, acc3 * inv[:, None])
        tl.store(lse_ptr + (n * num_splits + split) * H + h, lse)
    else:  # final bf16 output, rounded to nearest even on the CPU as on the GPU
        tl.store(out_ptr + o_row, _to_bf16(acc0 * inv[:, None]))
        tl.store(out_ptr + o_row + 128, _to_bf16(acc1 * inv[:, None]))
        tl.store(out_ptr + o_row + 256, _to_bf16(acc2 * inv[:, None]))
        tl.store(out_ptr + o_row + 384, _to_bf16(acc3 * inv[:, None]))
        tl.store(lse_ptr + n * H + h, lse * _LN2)


@triton.jit
def _merge_splits_kernel(
    part_ptr, part_lse_ptr, out_ptr, lse_ptr, num_splits,
    H: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Combine the splits of one (row, head) by their log-sum-exp, BLOCK_D value columns per program.

    All splits come in one [SPLITS, BLOCK_D] load, so even batch 1 runs H * 512 / BLOCK_D short
    programs instead of a few that loop over the splits.
    """
    pid = tl.program_id(0)
    cols = (pid % (512 // BLOCK_D)) * BLOCK_D + tl.arange(0, BLOCK_D)
    nh = pid // (512 // BLOCK_D)  # n * H + h
    s = tl.arange(0, SPLITS)
    ok = s < num_splits
    part = (nh // H * num_splits + s).to(tl.int64) * H + nh % H
    lse = tl.load(part_lse_ptr + part, mask=ok, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # every split empty: weights 0, lse -inf
    w = tl.exp2(lse - top)
    total = tl.sum(w, axis=0)
    vals = tl.load(part_ptr + part[:, None] * 512 + cols[None, :], mask=ok[:, None], other=0.0)
    has = total > 0
    inv = tl.where(has, 1.0 / tl.where(has, total, 1.0), 0.0)
    tl.store(out_ptr + nh.to(tl.int64) * 512 + cols, _to_bf16(tl.sum(vals * w[:, None], axis=0) * inv))
    if pid % (512 // BLOCK_D) == 0:
        tl.store(lse_ptr + nh, tl.where(has, (top + tl.log2(tl.where(has, total, 1.0))) * _LN2, float("-inf")))


def mla_config(n: int, heads: int, topk: int, num_sms: int = 132) -> dict:
    """Tile shape and top-k split count for N query rows of `heads` heads.

    From the H200 sweep (docs/PERFORMANCE.md): 64-head, 64-key tiles on 8 warps everywhere.
    Prefill-sized grids (keys from L2) run one stage; decode grids that cover the SMs run three;
    smaller grids split top-k into at most one wave of programs, down to 64 keys per split, and
    run two stages (the merge is one small extra launch).
    """
    block_h = 64 if heads % 64 == 0 else 16
    programs = n * (heads // block_h)
    if programs >= 16 * num_sms:
        return dict(BLOCK_H=block_h, BLOCK_N=64, SPLIT=1, num_warps=8, num_stages=1)
    split = 1
    while programs * split * 2 <= num_sms and topk // (split * 2) >= 64:
        split *= 2
    return dict(BLOCK_H=block_h, BLOCK_N=64, SPLIT=split, num_warps=8, num_stages=2 if split > 1 else 3)


def sparse_mla(
    q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor, sm_scale: float,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, H, 576] bf16, kv_pool bf16 [S, 576] or uint8 [S, 656], indices [N, topk] int32.

    Returns out [N, H, 512] bf16 and lse [N, H] float32 (natural log, -inf for an empty row).
    """
    n, heads, d_qk = q.shape
    if d_qk != KV_LORA_RANK + ROPE_DIM or q.dtype != torch.bfloat16 or q.stride(-1) != 1:
        raise ValueError(f"q must be bf16 [N, H, {KV_LORA_RANK + ROPE_DIM}] with unit last stride")
    fp8 = kv_pool.dtype == torch.uint8
    if fp8 and (kv_pool.shape[-1] != MLA_FP8_BYTES or not kv_pool.is_contiguous()):
        raise ValueError(f"FP8 MLA pool must be contiguous uint8 [S, {MLA_FP8_BYTES}]")
    if not fp8 and (kv_pool.dtype != torch.bfloat16 or kv_pool.shape[-1] != d_qk or kv_pool.stride(-1) != 1):
        raise ValueError(f"bf16 MLA pool must be bf16 [S, {d_qk}] with unit last stride")
    if indices.shape[0] != n or indices.stride(-1) != 1:
        raise ValueError(f"indices must be [N={n}, topk] with unit last stride, got {tuple(indices.shape)}")
    topk = indices.shape[1]
    cfg = dict(config or mla_config(n, heads, topk))
    split = cfg.pop("SPLIT")
    if heads % cfg["BLOCK_H"]:
        raise ValueError(f"heads ({heads}) must be a multiple of BLOCK_H ({cfg['BLOCK_H']})")
    if split < 1:
        raise ValueError(f"SPLIT must be >= 1, got {split}")
    out = torch.empty(n, heads, KV_LORA_RANK, device=q.device, dtype=torch.bfloat16)
    lse = torch.empty(n, heads, device=q.device, dtype=torch.float32)
    if n == 0:
        return out, lse
    if fp8:
        views = (kv_pool.view(torch.float8_e4m3fn), kv_pool.view(torch.float32), kv_pool.view(torch.bfloat16))
        stride_kv = MLA_FP8_BYTES
    else:
        views = (kv_pool, kv_pool, kv_pool)
        stride_kv = kv_pool.stride(0)
    keys_per_split = triton.cdiv(triton.cdiv(topk, split), cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    part, part_lse = out, lse
    if split > 1:
        part = torch.empty(n, split, heads, KV_LORA_RANK, device=q.device, dtype=torch.float32)
        part_lse = torch.empty(n, split, heads, device=q.device, dtype=torch.float32)
    _sparse_mla_kernel[(n * split * (heads // cfg["BLOCK_H"]),)](
        q, q.stride(0), q.stride(1), *views, stride_kv, kv_pool.shape[0], indices, indices.stride(0), topk,
        part, part_lse, sm_scale * _LOG2E, keys_per_split, split,
        H=heads, FP8=fp8, PARTIAL=split > 1, UPCAST=INTERPRET, **cfg,
    )
    if split > 1:
        _merge_splits_kernel[(n * heads * (KV_LORA_RANK // _MERGE_D),)](
            part, part_lse, out, lse, split, H=heads, SPLITS=triton.next_power_of_2(split), BLOCK_D=_MERGE_D)
    return out, lse

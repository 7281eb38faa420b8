"""Sparse MLA attention in Triton: absorbed q [N, H, 576] over the top-k rows of the latent cache.

One kernel serves decode (paged pool, bf16 [S, 576] or FP8 [S, 656]) and prefill (a bf16
[Nk, 576] buffer is just a pool): rows are gathered by index, -1 (or >= S) is skipped. The
latent is handled as four 128-wide tiles so an FP8 row needs no dequantized copy: its tile scale
multiplies the [heads, keys] scores (QK) and the probabilities (PV) instead of the values.
When N * H / BLOCK_H programs cannot fill the GPU, the top-k range is split across programs
and the partial results are merged by their log-sum-exp (split-K, as FlashMLA does).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dsa_backend.cache.layout import KV_LORA_RANK, MLA_FP8_BYTES, ROPE_DIM

from .cache_store import _to_bf16
from .triton_dot import INTERPRET, dot

_LOG2E = 1.4426950408889634


@triton.jit
def _sparse_mla_kernel(
    q_ptr, stride_qn, stride_qh, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
    idx_ptr, stride_idx, topk, out_ptr, lse_ptr, scale_log2, keys_per_split,
    H: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
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
    for j0 in range(0, keys_per_split, BLOCK_N):
        j = lo + j0 + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + n.to(tl.int64) * stride_idx + j, mask=j < topk, other=-1)
        ok = (idx >= 0) & (idx < num_slots)
        row = tl.where(ok, idx, 0).to(tl.int64) * stride_kv
        if FP8:
            # row bytes: 512 e4m3 | 4 fp32 tile scales | 64 bf16 rope
            k0 = tl.load(kv_ptr + row[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.bfloat16)
            k1 = tl.load(kv_ptr + row[:, None] + 128 + d[None, :], mask=ok[:, None], other=0.0).to(tl.bfloat16)
            k2 = tl.load(kv_ptr + row[:, None] + 256 + d[None, :], mask=ok[:, None], other=0.0).to(tl.bfloat16)
            k3 = tl.load(kv_ptr + row[:, None] + 384 + d[None, :], mask=ok[:, None], other=0.0).to(tl.bfloat16)
            s0 = tl.load(kv_f32_ptr + row // 4 + 128, mask=ok, other=0.0)
            s1 = tl.load(kv_f32_ptr + row // 4 + 129, mask=ok, other=0.0)
            s2 = tl.load(kv_f32_ptr + row // 4 + 130, mask=ok, other=0.0)
            s3 = tl.load(kv_f32_ptr + row // 4 + 131, mask=ok, other=0.0)
            kr = tl.load(kv_bf16_ptr + row[:, None] // 2 + 264 + dr[None, :], mask=ok[:, None], other=0.0)
            qk = dot(qr, tl.trans(kr), UPCAST)
            qk += dot(q0, tl.trans(k0), UPCAST) * s0[None, :]
            qk += dot(q1, tl.trans(k1), UPCAST) * s1[None, :]
            qk += dot(q2, tl.trans(k2), UPCAST) * s2[None, :]
            qk += dot(q3, tl.trans(k3), UPCAST) * s3[None, :]
        else:
            k0 = tl.load(kv_ptr + row[:, None] + d[None, :], mask=ok[:, None], other=0.0)
            k1 = tl.load(kv_ptr + row[:, None] + 128 + d[None, :], mask=ok[:, None], other=0.0)
            k2 = tl.load(kv_ptr + row[:, None] + 256 + d[None, :], mask=ok[:, None], other=0.0)
            k3 = tl.load(kv_ptr + row[:, None] + 384 + d[None, :], mask=ok[:, None], other=0.0)
            kr = tl.load(kv_ptr + row[:, None] + 512 + dr[None, :], mask=ok[:, None], other=0.0)
            qk = dot(qr, tl.trans(kr), UPCAST)
            qk += dot(q0, tl.trans(k0), UPCAST)
            qk += dot(q1, tl.trans(k1), UPCAST)
            qk += dot(q2, tl.trans(k2), UPCAST)
            qk += dot(q3, tl.trans(k3), UPCAST)
        qk = tl.where(ok[None, :], qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing valid yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(qk - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        if FP8:
            acc0 = acc0 * alpha[:, None] + dot((p * s0[None, :]).to(tl.bfloat16), k0, UPCAST)
            acc1 = acc1 * alpha[:, None] + dot((p * s1[None, :]).to(tl.bfloat16), k1, UPCAST)
            acc2 = acc2 * alpha[:, None] + dot((p * s2[None, :]).to(tl.bfloat16), k2, UPCAST)
            acc3 = acc3 * alpha[:, None] + dot((p * s3[None, :]).to(tl.bfloat16), k3, UPCAST)
        else:
            pb = p.to(tl.bfloat16)
            acc0 = acc0 * alpha[:, None] + dot(pb, k0, UPCAST)
            acc1 = acc1 * alpha[:, None] + dot(pb, k1, UPCAST)
            acc2 = acc2 * alpha[:, None] + dot(pb, k2, UPCAST)
            acc3 = acc3 * alpha[:, None] + dot(pb, k3, UPCAST)
    has = l_i > 0
    l_safe = tl.where(has, l_i, 1.0)
    inv = tl.where(has, 1.0 / l_safe, 0.0)
    lse = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))  # base 2
    o_row = ((n * SPLIT + split) * H + h).to(tl.int64)[:, None] * 512 + d[None, :]
    if SPLIT == 1:  # final bf16 output, rounded to nearest even on the CPU as on the GPU
        tl.store(out_ptr + o_row, _to_bf16(acc0 * inv[:, None]))
        tl.store(out_ptr + o_row + 128, _to_bf16(acc1 * inv[:, None]))
        tl.store(out_ptr + o_row + 256, _to_bf16(acc2 * inv[:, None]))
        tl.store(out_ptr + o_row + 384, _to_bf16(acc3 * inv[:, None]))
    else:  # float32 partials for the split merge
        tl.store(out_ptr + o_row, acc0 * inv[:, None])
        tl.store(out_ptr + o_row + 128, acc1 * inv[:, None])
        tl.store(out_ptr + o_row + 256, acc2 * inv[:, None])
        tl.store(out_ptr + o_row + 384, acc3 * inv[:, None])
    tl.store(lse_ptr + (n * SPLIT + split) * H + h, lse)


def mla_config(n: int, heads: int, topk: int, num_sms: int = 132) -> dict:
    """Tile shape and split count: split top-k only while programs would leave half the SMs idle.

    From the H200 runs (docs/PERFORMANCE.md): prefill-sized grids (many waves of programs, keys
    from L2) run best on 64-key tiles and 8 warps; unsplit decode (random rows of a large pool) on
    32-key tiles and 4 warps, which spill least; split decode on 64-key tiles, 8 warps, two stages.
    """
    block_h = 64 if heads % 64 == 0 else 16
    programs = n * (heads // block_h)
    if programs >= 16 * num_sms:
        return dict(BLOCK_H=block_h, BLOCK_N=64, SPLIT=1, num_warps=8, num_stages=1)
    split = 1
    while programs * split * 2 < num_sms and topk // (split * 2) >= 512:
        split *= 2
    if split == 1:
        return dict(BLOCK_H=block_h, BLOCK_N=32, SPLIT=1, num_warps=4, num_stages=1)
    return dict(BLOCK_H=block_h, BLOCK_N=64, SPLIT=split, num_warps=8, num_stages=2)


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
    split = cfg["SPLIT"]
    if heads % cfg["BLOCK_H"]:
        raise ValueError(f"heads ({heads}) must be a multiple of BLOCK_H ({cfg['BLOCK_H']})")
    keys_per_split = triton.cdiv(triton.cdiv(topk, split), cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    out_dtype = torch.bfloat16 if split == 1 else torch.float32
    out = torch.empty(n, split, heads, KV_LORA_RANK, device=q.device, dtype=out_dtype)
    lse = torch.empty(n, split, heads, device=q.device, dtype=torch.float32)
    if n == 0:
        return out.view(n, heads, KV_LORA_RANK).to(torch.bfloat16), lse.view(n, heads)
    if fp8:
        views = (kv_pool.view(torch.float8_e4m3fn), kv_pool.view(torch.float32), kv_pool.view(torch.bfloat16))
        stride_kv = MLA_FP8_BYTES
    else:
        views = (kv_pool, kv_pool, kv_pool)
        stride_kv = kv_pool.stride(0)
    grid = (n, heads // cfg["BLOCK_H"], split)
    _sparse_mla_kernel[grid](
        q, q.stride(0), q.stride(1), *views, stride_kv, kv_pool.shape[0],
        indices, indices.stride(0), topk, out, lse, sm_scale * _LOG2E, keys_per_split,
        H=heads, FP8=fp8, UPCAST=INTERPRET, **cfg,
    )
    if split == 1:
        return out.view(n, heads, KV_LORA_RANK), lse.view(n, heads) * math.log(2.0)
    # merge the splits by their log-sum-exp (base 2 inside the kernel)
    top = lse.amax(dim=1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    wgt = torch.exp2(lse - top)
    total = wgt.sum(dim=1)
    merged = (out * wgt[..., None]).sum(dim=1) / total.clamp_min(1e-30)[..., None]
    merged_lse = torch.where(total > 0, top.squeeze(1) + torch.log2(total), float("-inf"))
    return merged.to(torch.bfloat16), merged_lse * math.log(2.0)

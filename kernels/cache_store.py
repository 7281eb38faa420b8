"""Triton stores into the two KV pools: indexer keys (FP8, paged) and the MLA latent (bf16 or FP8).

Each writes exactly the bytes of dsa_backend.cache.layout (references in kernels/reference.py):
the scale is amax / 448 with IEEE division (div_rn), the same expression the reference
evaluates, so the bytes match bit for bit. Slots < 0 are skipped (padded rows of a CUDA graph).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsa_backend.cache.layout import INDEX_FP8_BYTES, INDEX_HEAD_DIM, KV_LORA_RANK, MLA_FP8_BYTES, ROPE_DIM

from .host_math import cdiv
from .reference import hadamard_matrix

_HADAMARD: dict = {}


@triton.jit
def _round_to_e4m3(v):
    """Round float32 v (|v| <= 448) to the nearest e4m3 value, ties to even, still in float32.

    Done by hand so that the cast after it is exact: Triton's interpreter (3.6) drops the carry
    when rounding crosses a power of two (127.9 -> 64), and the GPU must agree with the CPU.
    """
    bits = v.to(tl.uint32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & 0xFFF00000).to(tl.float32, bitcast=True)
    # below 2^-6 e4m3 is subnormal with a fixed step of 2^-9: round |v| on a float32 whose ulp is
    # that, then put the sign back (a negative that rounds to zero is -0, as torch's cast gives)
    magic = 24576.0
    magnitude = ((tl.abs(v) + magic) - magic).to(tl.uint32, bitcast=True)
    subnormal = (magnitude | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(v) < 0.015625, subnormal, normal)


@triton.jit
def _to_bf16(x):
    """float -> bfloat16 with ties to even (the interpreter's own cast truncates)."""
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)


@triton.jit(do_not_specialize=["num_tokens"])  # kernels/specialization.py
def _store_index_keys_kernel(
    keys_ptr, stride_keys, slots_ptr, had_ptr, vals_ptr, scales_ptr, num_tokens,
    PAGE: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, ROTATE: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, D)
    slot = tl.load(slots_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    ok = slot >= 0
    x = tl.load(keys_ptr + t[:, None].to(tl.int64) * stride_keys + d[None, :], mask=ok[:, None], other=0.0)
    x = x.to(tl.float32)
    if ROTATE:
        h = tl.load(had_ptr + d[:, None] * D + d[None, :])
        x = tl.dot(x, h, input_precision="ieee")
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    v = tl.math.div_rn(x, scale[:, None])
    v = _round_to_e4m3(tl.minimum(tl.maximum(v, -448.0), 448.0)).to(tl.float8e4nv)
    page = slot // PAGE
    off = slot % PAGE
    page_bytes = PAGE * (D + 4)
    tl.store(vals_ptr + (page * page_bytes + off * D)[:, None] + d[None, :], v, mask=ok[:, None])
    # scales are float32 words after the page's PAGE*D value bytes
    tl.store(scales_ptr + (page * page_bytes + PAGE * D) // 4 + off, scale, mask=ok)


def store_index_keys(
    pool: torch.Tensor, keys: torch.Tensor, slots: torch.Tensor, page_size: int, rotate: bool = False
) -> None:
    """Quantize keys [T, 128] (optionally Hadamard-rotate first) into pool [pages, P*132] uint8."""
    if pool.dtype != torch.uint8 or pool.shape[-1] != page_size * INDEX_FP8_BYTES or not pool.is_contiguous():
        raise ValueError(f"index pool must be contiguous uint8 [pages, {page_size}*{INDEX_FP8_BYTES}]")
    if keys.shape[-1] != INDEX_HEAD_DIM or keys.stride(-1) != 1:
        raise ValueError(f"keys must be [T, {INDEX_HEAD_DIM}] with unit last stride, got {tuple(keys.shape)}")
    num_tokens = keys.shape[0]
    if num_tokens == 0:
        return
    had = pool  # unused placeholder pointer when not rotating
    if rotate:
        key = str(keys.device)
        if key not in _HADAMARD:
            _HADAMARD[key] = hadamard_matrix(INDEX_HEAD_DIM, keys.device).contiguous()
        had = _HADAMARD[key]
    block_t = 16
    _store_index_keys_kernel[(cdiv(num_tokens, block_t),)](
        keys, keys.stride(0), slots, had, pool.view(torch.float8_e4m3fn), pool.view(torch.float32),
        num_tokens, PAGE=page_size, D=INDEX_HEAD_DIM, BLOCK_T=block_t, ROTATE=rotate, num_warps=4,
    )


@triton.jit(do_not_specialize=["num_tokens"])  # kernels/specialization.py
def _store_mla_bf16_kernel(
    lat_ptr, stride_lat, rope_ptr, stride_rope, slots_ptr, pool_ptr, stride_pool, num_tokens,
    DL: tl.constexpr, DR: tl.constexpr, BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slots_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    ok = (slot >= 0)[:, None]
    t64 = t[:, None].to(tl.int64)
    dl = tl.arange(0, DL)[None, :]
    dr = tl.arange(0, DR)[None, :]
    lat = tl.load(lat_ptr + t64 * stride_lat + dl, mask=ok, other=0.0)
    rope = tl.load(rope_ptr + t64 * stride_rope + dr, mask=ok, other=0.0)
    row = pool_ptr + slot[:, None] * stride_pool
    tl.store(row + dl, _to_bf16(lat), mask=ok)
    tl.store(row + DL + dr, _to_bf16(rope), mask=ok)


@triton.jit(do_not_specialize=["num_tokens"])  # kernels/specialization.py
def _store_mla_fp8_kernel(
    lat_ptr, stride_lat, rope_ptr, stride_rope, slots_ptr, vals_ptr, scales_ptr, rope_out_ptr, num_tokens,
    ROW: tl.constexpr, TILE: tl.constexpr, NT: tl.constexpr, DR: tl.constexpr, BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(slots_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    ok = slot >= 0
    t64 = t.to(tl.int64)
    tile = tl.arange(0, NT)
    d = tl.arange(0, TILE)
    col = tile[None, :, None] * TILE + d[None, None, :]  # [1, NT, TILE]
    ok3 = ok[:, None, None]
    x = tl.load(lat_ptr + t64[:, None, None] * stride_lat + col, mask=ok3, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=2), 1e-4)  # [BLOCK_T, NT]
    scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    v = tl.math.div_rn(x, scale[:, :, None])
    v = _round_to_e4m3(tl.minimum(tl.maximum(v, -448.0), 448.0)).to(tl.float8e4nv)
    tl.store(vals_ptr + slot[:, None, None] * ROW + col, v, mask=ok3)
    # bytes [512, 528): NT float32 scales; bytes [528, 656): DR bf16 rope values
    tl.store(scales_ptr + (slot * ROW + NT * TILE)[:, None] // 4 + tile[None, :], scale, mask=ok[:, None])
    dr = tl.arange(0, DR)
    rope = tl.load(rope_ptr + t64[:, None] * stride_rope + dr[None, :], mask=ok[:, None], other=0.0)
    rope_at = (slot * ROW + NT * TILE + NT * 4)[:, None] // 2 + dr[None, :]
    tl.store(rope_out_ptr + rope_at, _to_bf16(rope), mask=ok[:, None])


def store_mla(pool: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor, slots: torch.Tensor) -> None:
    """Write latent [T, 512] and rope [T, 64] at pool[slot]; pool bf16 [S, 576] or uint8 [S, 656]."""
    if latent.shape[-1] != KV_LORA_RANK or rope.shape[-1] != ROPE_DIM:
        raise ValueError(f"latent/rope must be [T, {KV_LORA_RANK}] / [T, {ROPE_DIM}]")
    if latent.stride(-1) != 1 or rope.stride(-1) != 1:
        raise ValueError("latent and rope need a unit last stride")
    num_tokens = latent.shape[0]
    if num_tokens == 0:
        return
    block_t = 8
    grid = (cdiv(num_tokens, block_t),)
    if pool.dtype == torch.uint8:
        if pool.shape[-1] != MLA_FP8_BYTES or not pool.is_contiguous():
            raise ValueError(f"FP8 MLA pool must be contiguous uint8 [S, {MLA_FP8_BYTES}]")
        _store_mla_fp8_kernel[grid](
            latent, latent.stride(0), rope, rope.stride(0), slots,
            pool.view(torch.float8_e4m3fn), pool.view(torch.float32), pool.view(torch.bfloat16), num_tokens,
            ROW=MLA_FP8_BYTES, TILE=128, NT=KV_LORA_RANK // 128, DR=ROPE_DIM, BLOCK_T=block_t, num_warps=4,
        )
    else:
        if pool.dtype != torch.bfloat16 or pool.shape[-1] != KV_LORA_RANK + ROPE_DIM or pool.stride(-1) != 1:
            raise ValueError(f"bf16 MLA pool must be [S, {KV_LORA_RANK + ROPE_DIM}] with unit last stride")
        _store_mla_bf16_kernel[grid](
            latent, latent.stride(0), rope, rope.stride(0), slots, pool, pool.stride(0), num_tokens,
            DL=KV_LORA_RANK, DR=ROPE_DIM, BLOCK_T=block_t, num_warps=4,
        )

"""RMSNorm and RoPE in one launch each, for bfloat16 activations.

In PyTorch ops an RMSNorm is eight kernels and a RoPE nine; at decode sizes each kernel costs its
launch, not its bytes. On an H100 a CUDA-graph decode forward of the DeepSeek-V3.2 slice ran ~700
kernels, ~230 of them these two (docs/PERFORMANCE.md, "Norms and RoPE in one kernel each").

Both round where the references (kernels/reference.py) round, in the same order: RoPE gives their
bf16 results bit for bit (every product and sum of two bf16 values is exact in float32 before the
rounding); RMSNorm sums the squares in another order, so its rows may differ in the last bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cache_store import _to_bf16
from .host_math import cdiv, next_power_of_2


@triton.jit(do_not_specialize=["eps"])
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, eps, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / N + eps)
    normed = _to_bf16(x * inv_rms).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, _to_bf16(w * normed), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x * rsqrt(mean(x^2) + eps)) over the last dim: bf16 x [..., N] (rows may be
    strided, the last dim contiguous), normalized in float32, rounded to bf16, then scaled."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # a view wherever the rows have one stride
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, rows.stride(0), n, eps, N=n,
                                           BLOCK=next_power_of_2(n), num_warps=4 if n <= 4096 else 8)
    return out.view(x.shape)


@triton.jit(do_not_specialize=["num_heads", "stride_pt", "stride_ph"])
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, prefix_ptr, num_heads, stride_xt, stride_xh, stride_ct,
                 stride_pt, stride_ph, D: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr,
                 INTERLEAVED: tl.constexpr, PREFIX: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, HALF)
    ok = h < num_heads
    row = x_ptr + t * stride_xt + h[:, None].to(tl.int64) * stride_xh
    out_row = out_ptr + (t * num_heads + h[:, None].to(tl.int64)) * (PREFIX + D)
    if PREFIX > 0:  # copied in front of the rotated row
        j = tl.arange(0, PREFIX)
        prefix = prefix_ptr + t * stride_pt + h[:, None].to(tl.int64) * stride_ph + j[None, :]
        tl.store(out_row + j[None, :], tl.load(prefix, mask=ok[:, None]), mask=ok[:, None])
    if INTERLEAVED:
        first, second = 2 * i, 2 * i + 1
    else:
        first, second = i, i + HALF
    x1 = tl.load(row + first[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(row + second[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    # cos and sin in x's dtype first, every product and sum rounded to it, as the reference
    c = _to_bf16(tl.load(cos_ptr + t * stride_ct + i)).to(tl.float32)[None, :]
    s = _to_bf16(tl.load(sin_ptr + t * stride_ct + i)).to(tl.float32)[None, :]
    r1 = _to_bf16(_to_bf16(x1 * c).to(tl.float32) - _to_bf16(x2 * s).to(tl.float32))
    r2 = _to_bf16(_to_bf16(x2 * c).to(tl.float32) + _to_bf16(x1 * s).to(tl.float32))
    out = out_row + PREFIX
    tl.store(out + i[None, :], r1, mask=ok[:, None])
    tl.store(out + HALF + i[None, :], r2, mask=ok[:, None])
    if REST > 0:  # the dims past the rotated ones, copied
        j = 2 * HALF + tl.arange(0, REST)
        tl.store(out + j[None, :], tl.load(row + j[None, :], mask=ok[:, None]), mask=ok[:, None])


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
         rotary_dim: int | None = None, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D] or [T, H, D] bf16 (strided; the last dim contiguous) with its first rotary_dim
    dims (all by default) rotated by cos / sin [T, rotary_dim / 2] float32, the rest copied; a
    new contiguous tensor. Rotated pairs come out as in the reference: interleaved pairs
    (x0, x1), (x2, x3).. de-interleaved (rotated evens, then rotated odds), half-split pairs
    (x_i, x_i+R/2) in place. prefix [T, H, P] (strided, the last dim contiguous), when given,
    comes first in each output row: [prefix | rope(x)], the absorbed MLA query without a cat."""
    d = x.shape[-1]
    r = rotary_dim or d
    view = x if x.dim() == 3 else x.unsqueeze(1)
    t, heads = view.shape[:2]
    p = 0 if prefix is None else prefix.shape[-1]
    out = torch.empty((t, heads, p + d), dtype=x.dtype, device=x.device)
    block_h = min(16, next_power_of_2(heads))
    pre = view if prefix is None else prefix
    if t:
        _rope_kernel[(t, cdiv(heads, block_h))](view, cos, sin, out, pre, heads, view.stride(0), view.stride(1),
                                                cos.stride(0), pre.stride(0), pre.stride(1), D=d, HALF=r // 2,
                                                REST=d - r, INTERLEAVED=interleaved, PREFIX=p, BLOCK_H=block_h,
                                                num_warps=4)
    return out.view(*x.shape[:-1], p + d)

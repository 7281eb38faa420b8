"""Top-k over indexer logits with the paged or ragged transform fused in, in Triton.

One program per row finds the exact k-th largest value by radix select on the float's ordered
bit pattern (four 8-bit passes, each one histogram over the row, which stays in L2), then writes
the selected positions in ascending order, taking ties at the threshold lowest position first.
The result equals kernels/reference.topk_positions_ref bit for bit. Rows no longer than k skip
the search and return every position (dense attention for short sequences).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TRANSFORM_NONE, TRANSFORM_PAGED, TRANSFORM_RAGGED = 0, 1, 2


@triton.jit
def _ordered_key(x):
    """float32 -> uint32 whose unsigned order is the float order (-0.0 folded into 0.0)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
    return bits ^ flip


@triton.jit
def _scalar(x):
    """A loaded scalar as a 0-d value (the interpreter hands back shape-(1,) arrays that range() rejects)."""
    return tl.max(tl.zeros((1,), x.dtype) + x, axis=0)


@triton.jit
def _transform(pos, row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE: tl.constexpr, TRANSFORM: tl.constexpr):
    """Positions (-1 = none) -> positions, pool slots (paged) or ragged indices."""
    ok = pos >= 0
    if TRANSFORM == 1:
        req = (row // NEXT_N).to(tl.int64)
        page = tl.load(bt_ptr + req * stride_bt + pos // PAGE, mask=ok, other=0)
        pos = tl.where(ok, page * PAGE + pos % PAGE, -1)
    elif TRANSFORM == 2:
        pos = tl.where(ok, pos + tl.load(offs_ptr + row), -1)
    return pos


@triton.jit
def _topk_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, out_ptr, stride_out,
    bt_ptr, stride_bt, offs_ptr, NEXT_N,
    K: tl.constexpr, BLOCK: tl.constexpr, HAS_STARTS: tl.constexpr, PAGE: tl.constexpr,
    TRANSFORM: tl.constexpr,
):
    row = tl.program_id(0)
    length = _scalar(tl.load(lens_ptr + row))
    base = logits_ptr + row.to(tl.int64) * stride_logits
    if HAS_STARTS:
        base += tl.load(starts_ptr + row)
    out_row = out_ptr + row.to(tl.int64) * stride_out
    offs = tl.arange(0, BLOCK)
    if length <= K:
        for c in range(0, K, BLOCK):
            pos = c + offs
            val = _transform(tl.where(pos < length, pos, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
            tl.store(out_row + pos, val.to(tl.int32), mask=pos < K)
    else:
        # Radix select: after pass p, `prefix` holds the top 8*(p+1) bits of the k-th largest key
        # and `need` how many elements sharing that prefix still belong to the top k.
        prefix = tl.zeros((), tl.uint32)
        need = K
        bins = tl.arange(0, 256)
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros((256,), tl.int32)
            for c in range(0, length, BLOCK):
                pos = c + offs
                live = pos < length
                key = _ordered_key(tl.load(base + pos, mask=live, other=0.0))
                if p > 0:
                    live = live & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=live)
            at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
            digit = tl.max(tl.where(at_or_above >= need, bins, -1), axis=0)
            need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
            prefix = prefix | (digit.to(tl.uint32) << shift)
        # Write everything above the threshold key and the first `need` ties, in position order.
        written = tl.zeros((), tl.int32)
        ties = tl.zeros((), tl.int32)
        for c in range(0, length, BLOCK):
            pos = c + offs
            live = pos < length
            key = _ordered_key(tl.load(base + pos, mask=live, other=0.0))
            eq = live & (key == prefix)
            tie_rank = ties + tl.cumsum(eq.to(tl.int32), axis=0)
            sel = (live & (key > prefix)) | (eq & (tie_rank <= need))
            sel_i = sel.to(tl.int32)
            slot = written + tl.cumsum(sel_i, axis=0) - 1
            val = _transform(pos, row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
            tl.store(out_row + slot, val.to(tl.int32), mask=sel)
            written += tl.sum(sel_i, axis=0)
            ties += tl.sum(eq.to(tl.int32), axis=0)


def topk_transform(
    logits: torch.Tensor, lengths: torch.Tensor, k: int, transform: int = TRANSFORM_NONE, *,
    row_starts: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
    page_size: int = 1, next_n: int = 1, offsets: torch.Tensor | None = None, block: int | None = None,
) -> torch.Tensor:
    """logits [N, W] fp32, lengths [N] -> [N, k] int32: positions, slots or ragged indices, -1 padded.

    Row i ranks logits[i, row_starts[i] : row_starts[i] + lengths[i]]; argument checks live in
    kernels/dispatch.py.
    """
    n = logits.shape[0]
    out = torch.empty(n, k, device=logits.device, dtype=torch.int32)
    if n == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    dummy = lengths
    bt = block_table if block_table is not None else dummy
    block = block or min(4096, max(triton.next_power_of_2(k), 256))
    _topk_kernel[(n,)](
        logits, logits.stride(0), row_starts if row_starts is not None else dummy, lengths,
        out, out.stride(0), bt, bt.stride(0) if block_table is not None else 0,
        offsets if offsets is not None else dummy, next_n,
        K=k, BLOCK=block, HAS_STARTS=row_starts is not None, PAGE=page_size, TRANSFORM=transform,
        num_warps=8 if block >= 2048 else 4,
    )
    return out

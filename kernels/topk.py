"""Exact top-k over indexer logits with the paged or ragged transform fused in, in Triton.

A row is cut into blocks of keys, one program per block (topk_config sizes them so that small
batches still fill the GPU). Four launches, plus a memset of one counter per row:

1. threshold, one program per row: from a strided sample of the row, the key t0 that the sample
   ranks five standard deviations below the k-th (three radix steps in registers).
2. candidates, rows x blocks: append the positions of the block whose key is >= t0 to the row's
   candidate list through an atomic counter (list order is free).
3. select, one program per row: exact radix select over the candidates (six 6-bit digits), then
   the output slot where each block starts and how many threshold ties precede it. A row with
   fewer than k candidates (the sample misled) or more than `cap` (e.g. massive ties) is searched
   over its whole range instead: slower, still exact.
4. write, rows x blocks: each block writes its selected positions in ascending order, transformed.

The two row-wide passes run on many small programs because they are latency-bound, not
bandwidth-bound: an H200 profile of the earlier two-programs-per-SM version spent 0.13 ms
writing 64 MB of logits (batch 128, 128K keys).

Keys are the float's ordered bit pattern, so the result equals kernels/reference.topk_positions_ref
bit for bit: ties at the threshold go to the lowest positions, rows no longer than k return every
position then -1. Scratch per row: `cap` int32 candidates, t0, and 2 * bins + 2 int32 of plan.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

TRANSFORM_NONE, TRANSFORM_PAGED, TRANSFORM_RAGGED = 0, 1, 2


@dataclass(frozen=True)
class TopkConfig:
    """block: keys per candidates/write program; sample: keys in the threshold sample; cap:
    candidates kept per row; select_block: candidates per step of the select loop."""

    block: int
    sample: int
    cap: int
    select_block: int


def topk_config(rows: int, width: int, k: int, num_sms: int) -> TopkConfig:
    """The one place tiling follows the shape: 4096-key blocks (one candidate-list atomic per
    4096 keys), smaller ones while the grid would leave SMs idle."""
    block = 4096
    while block > 1024 and rows * triton.cdiv(width, block) < 2 * num_sms:
        block //= 2
    # 1.3-1.7 k candidates are typical at 32K-128K keys (the sample's margin); 4 k leaves room.
    # Past 64K keys a 4096-key sample lets ~1% of rows pass 4096 candidates, the select block,
    # and the slowest row sets the kernel's time: with many rows, sample twice as many keys.
    sample = 8192 if width > 65536 and rows >= 16 else 4096
    return TopkConfig(block=block, sample=sample, cap=max(4 * k, 4096), select_block=4096)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


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
def _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS: tl.constexpr):
    """The row's length and a pointer to its first ranked logit."""
    base = logits_ptr + row.to(tl.int64) * stride_logits
    if HAS_STARTS:
        base += tl.load(starts_ptr + row)
    return _scalar(tl.load(lens_ptr + row)), base


# Digits of 6 bits: Triton 3.6 builds a histogram from one warp ballot per bit plus work per bin,
# so 64 bins cost about half as much per resolved bit as 256 (six steps cover a 32-bit key).
RADIX, BINS = tl.constexpr(6), tl.constexpr(64)


@triton.jit
def _digit_hist(key, live, prefix, STEP: tl.constexpr):
    """Histogram of digit STEP (0 = most significant) of the live keys sharing prefix's higher digits."""
    hi = 32 - RADIX * STEP
    lo = hi - RADIX if hi > RADIX else 0  # the last digit is narrower; its upper bins stay empty
    if STEP > 0:
        live = live & ((key >> hi) == (prefix >> hi))
    return tl.histogram(((key >> lo) & (BINS - 1)).to(tl.int32), BINS, mask=live)


@triton.jit
def _take_digit(hist, prefix, need, STEP: tl.constexpr):
    """Digit STEP of the need-th largest key: prefix extended by it, need less the keys above it."""
    bins = tl.arange(0, BINS)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    digit = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
    need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    lo = 32 - RADIX * (STEP + 1) if 32 > RADIX * (STEP + 1) else 0
    return prefix | (digit.to(tl.uint32) << lo), need


@triton.jit
def _sample_threshold(base, length, K: tl.constexpr, SAMPLE: tl.constexpr):
    """Key t0 (top 18 bits of a sampled key) with at least K of the row's keys >= t0 but for a ~3e-7 chance."""
    j = tl.arange(0, SAMPLE)
    if length > SAMPLE:
        pos = (j.to(tl.int64) * length) // SAMPLE
        expect = (K * SAMPLE + length - 1) // length
        # The sample's count above the row's k-th key is ~binomial: five standard deviations more
        # make a sample ranking t0 above it (fewer than K candidates, the slow fallback) a ~3e-7
        # event per row, while the ~3.4K candidates of a 128K row mostly fit one select block.
        target = tl.minimum(expect + (5.0 * tl.sqrt(expect.to(tl.float32))).to(tl.int32) + 1, SAMPLE)
    else:  # the sample is the row: its K-th key is exact
        pos = j.to(tl.int64)
        target = tl.zeros((), tl.int32) + K
    live = j < length
    key = _ordered_key(tl.load(base + pos, mask=live, other=0.0))
    t0 = tl.zeros((), tl.uint32)
    for step in tl.static_range(3):
        t0, target = _take_digit(_digit_hist(key, live, t0, step), t0, target, step)
    return t0


@triton.jit
def _threshold_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, t0_ptr,
    K: tl.constexpr, SAMPLE: tl.constexpr, HAS_STARTS: tl.constexpr,
):
    row = tl.program_id(0)
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    if length > K:
        tl.store(t0_ptr + row, _sample_threshold(base, length, K, SAMPLE).to(tl.int32, bitcast=True))


@triton.jit
def _candidates_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, t0_ptr, count_ptr, cand_ptr,
    K: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, HAS_STARTS: tl.constexpr,
):
    row = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    if (length > K) & (tl.program_id(1) * BLOCK < length):
        t0 = _scalar(tl.load(t0_ptr + row)).to(tl.uint32, bitcast=True)
        live = pos < length
        hit = (live & (_ordered_key(tl.load(base + pos, mask=live, other=0.0)) >= t0)).to(tl.int32)
        hits = tl.sum(hit, axis=0)
        if hits > 0:
            slot = tl.atomic_add(count_ptr + row, hits) + tl.cumsum(hit, axis=0) - 1
            # the counter keeps counting past CAP, which is how select sees the overflow
            tl.store(cand_ptr + row.to(tl.int64) * CAP + slot, pos, mask=(hit > 0) & (slot < CAP))


@triton.jit
def _load_items(base, cand, i, n_items, n_listed):
    """Keys and positions of items i: candidates below n_listed, the row's own positions above."""
    live = i < n_items
    listed = i < n_listed
    pos = tl.where(listed, tl.load(cand + i, mask=listed, other=0), i)
    return _ordered_key(tl.load(base + pos, mask=live, other=0.0)), live, pos


@triton.jit
def _block_counts(key, live, pos, thr, above, ties, WRITE_BLOCK, BLOCKS: tl.constexpr):
    """Per write block, add the items above the threshold key and those equal to it."""
    block = (pos // WRITE_BLOCK).to(tl.int32)
    above += tl.histogram(block, BLOCKS, mask=live & (key > thr))
    ties += tl.histogram(block, BLOCKS, mask=live & (key == thr))
    return above, ties


@triton.jit
def _select_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, count_ptr, cand_ptr, plan_ptr, WRITE_BLOCK,
    K: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr, HAS_STARTS: tl.constexpr,
):
    row = tl.program_id(0)
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    if length > K:
        n_cand = _scalar(tl.load(count_ptr + row))
        whole_row = (n_cand < K) | (n_cand > CAP)
        n_items = tl.where(whole_row, length, n_cand)
        n_listed = tl.where(whole_row, 0, n_cand)
        cand = cand_ptr + row.to(tl.int64) * CAP
        offs = tl.arange(0, BLOCK)
        # After each step `thr` holds more leading bits of the k-th largest key and `need` how many
        # keys sharing them still belong to the top k; at the end, how many ties to take.
        thr = tl.zeros((), tl.uint32)
        need = tl.zeros((), tl.int32) + K
        above = tl.zeros((BLOCKS,), tl.int32)
        ties = tl.zeros((BLOCKS,), tl.int32)
        if n_items <= BLOCK:
            # The usual case: the candidates fit one block, so they are gathered once and every
            # digit is resolved in registers instead of re-gathering them per digit.
            key, live, pos = _load_items(base, cand, offs, n_items, n_listed)
            for step in tl.static_range((32 + RADIX - 1) // RADIX):
                thr, need = _take_digit(_digit_hist(key, live, thr, step), thr, need, step)
            above, ties = _block_counts(key, live, pos, thr, above, ties, WRITE_BLOCK, BLOCKS)
        else:
            for step in tl.static_range((32 + RADIX - 1) // RADIX):
                hist = tl.zeros((BINS,), tl.int32)
                for c in range(0, n_items, BLOCK):
                    key, live, pos = _load_items(base, cand, c + offs, n_items, n_listed)
                    hist += _digit_hist(key, live, thr, step)
                thr, need = _take_digit(hist, thr, need, step)
            for c in range(0, n_items, BLOCK):
                key, live, pos = _load_items(base, cand, c + offs, n_items, n_listed)
                above, ties = _block_counts(key, live, pos, thr, above, ties, WRITE_BLOCK, BLOCKS)
        ties_before = tl.cumsum(ties, axis=0) - ties
        taken = above + tl.minimum(tl.maximum(need - ties_before, 0), ties)
        plan = plan_ptr + row.to(tl.int64) * (2 * BLOCKS + 2)
        blocks = tl.arange(0, BLOCKS)
        tl.store(plan + blocks, tl.cumsum(taken, axis=0) - taken)
        tl.store(plan + BLOCKS + blocks, ties_before)
        tl.store(plan + 2 * BLOCKS, thr.to(tl.int32, bitcast=True))
        tl.store(plan + 2 * BLOCKS + 1, need)


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
def _write_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, plan_ptr, out_ptr, stride_out,
    bt_ptr, stride_bt, offs_ptr, NEXT_N,
    K: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr, HAS_STARTS: tl.constexpr, PAGE: tl.constexpr,
    TRANSFORM: tl.constexpr,
):
    row = tl.program_id(0)
    block = tl.program_id(1)
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    out_row = out_ptr + row.to(tl.int64) * stride_out
    offs = tl.arange(0, BLOCK)
    if length <= K:
        if block == 0:  # dense: every position, then -1
            for c in range(0, K, BLOCK):
                pos = c + offs
                val = _transform(tl.where(pos < length, pos, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE,
                                 TRANSFORM)
                tl.store(out_row + pos, val.to(tl.int32), mask=pos < K)
    elif block * BLOCK < length:
        plan = plan_ptr + row.to(tl.int64) * (2 * BLOCKS + 2)
        written = _scalar(tl.load(plan + block))
        ties = _scalar(tl.load(plan + BLOCKS + block))
        thr = _scalar(tl.load(plan + 2 * BLOCKS)).to(tl.uint32, bitcast=True)
        need = _scalar(tl.load(plan + 2 * BLOCKS + 1))
        # Everything above the threshold key and the first `need` ties of the row, in position order.
        pos = block * BLOCK + offs
        live = pos < length
        key = _ordered_key(tl.load(base + pos, mask=live, other=0.0))
        eq = (live & (key == thr)).to(tl.int32)
        sel = live & (key > thr)
        if tl.sum(eq, axis=0) > 0:  # a block rarely holds the threshold key: skip its scan
            sel |= (eq > 0) & (ties + tl.cumsum(eq, axis=0) <= need)
        slot = written + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        val = _transform(pos, row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
        tl.store(out_row + slot, val.to(tl.int32), mask=sel)


def topk_transform(
    logits: torch.Tensor, lengths: torch.Tensor, k: int, transform: int = TRANSFORM_NONE, *,
    row_starts: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
    page_size: int = 1, next_n: int = 1, offsets: torch.Tensor | None = None, config: TopkConfig | None = None,
) -> torch.Tensor:
    """logits [N, W] fp32, lengths [N] int32 -> [N, k] int32: positions, slots or ragged indices, -1 padded.

    Row i ranks logits[i, row_starts[i] : row_starts[i] + lengths[i]] (within W); argument checks
    live in kernels/dispatch.py. `config` defaults to topk_config for the shape.
    """
    n, width = logits.shape
    out = torch.empty(n, k, device=logits.device, dtype=torch.int32)
    if n == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    cfg = config or topk_config(n, width, k, _num_sms(logits.device))
    blocks = max(1, triton.cdiv(width, cfg.block))
    bins = max(32, triton.next_power_of_2(blocks))  # tl.histogram wants a multiple of the warp size
    count = torch.zeros(n, device=logits.device, dtype=torch.int32)
    t0 = torch.empty(n, device=logits.device, dtype=torch.int32)
    cand = torch.empty(n, cfg.cap, device=logits.device, dtype=torch.int32)
    plan = torch.empty(n, 2 * bins + 2, device=logits.device, dtype=torch.int32)
    starts = row_starts if row_starts is not None else lengths
    row_args = (logits, logits.stride(0), starts, lengths)
    common = dict(K=k, HAS_STARTS=row_starts is not None)
    warps = 8 if cfg.block >= 4096 else 4
    _threshold_kernel[(n,)](*row_args, t0, SAMPLE=cfg.sample, num_warps=8, **common)
    _candidates_kernel[(n, blocks)](*row_args, t0, count, cand, CAP=cfg.cap, BLOCK=cfg.block, num_warps=warps,
                                    **common)
    _select_kernel[(n,)](*row_args, count, cand, plan, cfg.block, CAP=cfg.cap, BLOCK=cfg.select_block,
                         BLOCKS=bins, num_warps=16 if cfg.select_block >= 4096 else 4, **common)
    bt = block_table if block_table is not None else lengths
    _write_kernel[(n, blocks)](
        *row_args, plan, out, out.stride(0), bt, bt.stride(0) if block_table is not None else 0,
        offsets if offsets is not None else lengths, next_n,
        BLOCK=cfg.block, BLOCKS=bins, PAGE=page_size, TRANSFORM=transform, num_warps=warps, **common,
    )
    return out

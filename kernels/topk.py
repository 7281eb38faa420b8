"""Exact top-k over indexer logits with the paged or ragged transform fused in, in Triton.

topk_transform hands rows of up to 32K keys at any batch, and longer rows at small batch (where
every row's programs fit the SMs at once), to the single launch of kernels/topk_cooperative.py;
the rest take the three launches here.

Three launches, the two row-wide passes on many small programs because they are latency-bound,
not bandwidth-bound (topk_config sizes the key blocks so that small batches still fill the GPU):

1. threshold, one program per row: from a strided sample of the row, the key t0 that the sample
   ranks five standard deviations below the k-th (three radix steps in registers); it also zeroes
   the row's candidate counter.
2. candidates, rows x key blocks: append the positions of the block whose key is >= t0 to the
   row's candidate list with one atomic per block, so each block's candidates form one run of the
   list in position order (the runs themselves come in any order); record where the run starts.
3. select and write, one program per row: exact radix select over the candidates (6-bit digits;
   once at most `pair_cap` keys share the digits found, after two of the four on random rows of
   32K-128K keys, those keys are compared pairwise instead), then every selected position goes
   straight to its output slot: the block's rank in the row (counts per block) plus its rank
   within its run. A row with fewer than k candidates (the sample misled) or more than `cap`
   (e.g. massive ties) is searched over its whole range instead: slower, still exact.

Keys are the float's ordered bit pattern, so the result equals kernels/reference.topk_positions_ref
bit for bit, in ascending position order whatever order the runs were listed in: ties at the
threshold go to the lowest positions, rows no longer than k return every position then -1.
Scratch per row: `cap` int32 candidates, the counter, t0, one run start per key block, and
`pair_cap` int32 for the pairwise compare.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .device import num_sms
from .host_math import cdiv, next_power_of_2
from .triton_dot import INTERPRET

TRANSFORM_NONE, TRANSFORM_PAGED, TRANSFORM_RAGGED = 0, 1, 2
STORE_IN_PLACE = tl.constexpr(not INTERPRET)  # _scatter


@dataclass(frozen=True)
class TopkConfig:
    """block: keys per candidates program; sample: keys in the threshold sample; cap:
    candidates kept per row; select_block: candidates per step of the select loop; pair_cap: the
    most keys sharing the k-th key's leading digits that the select compares pairwise instead of
    taking more digit steps."""

    block: int
    sample: int
    cap: int
    select_block: int
    pair_cap: int = 64

    def __post_init__(self):
        if self.cap < self.select_block:  # the select reads a whole first block of the list
            raise ValueError(f"cap ({self.cap}) must be at least select_block ({self.select_block})")
        if self.pair_cap & (self.pair_cap - 1):
            raise ValueError(f"pair_cap ({self.pair_cap}) must be a power of two")


def topk_config(rows: int, width: int, k: int, num_sms: int) -> TopkConfig:
    """The one place tiling follows the shape: 2048-key blocks, 1024 while the grid would leave SMs
    idle (H200, docs/PERFORMANCE.md: 2048 beat 4096 by 3-11 us from batch 32 / 128K and batch 128
    / 32K up, and tied 1024)."""
    block = 2048
    while block > 1024 and rows * cdiv(width, block) < 2 * num_sms:
        block //= 2
    # 1.3-1.7 k candidates are typical at 32K-128K keys (the sample's margin); 4 k leaves room.
    # The margin grows as the sample shrinks: up to 32K keys a 2048-key sample keeps rows ~5
    # standard deviations below 4096 candidates (the select block) and costs ~1.5 us less than
    # 4096; past 64K a 4096-key sample lets ~1% of rows pass 4096 candidates, and the slowest
    # row sets the kernel's time: with many rows, sample 8192 keys there.
    sample = 2048 if width <= 32768 else 8192 if width > 65536 and rows >= 16 else 4096
    return TopkConfig(block=block, sample=sample, cap=max(4 * k, 4096), select_block=4096)


@functools.cache
def launch_choice(rows: int, width: int, k: int, num_sms: int) -> tuple:
    """What topk_transform compiles for logits [rows, width] on a GPU of num_sms SMs (where the
    driver takes the cooperative grid): ("one launch", parts, slice, chunks), or ("three
    launches", config)."""
    from .topk_cooperative import device_parts, slices

    parts = device_parts(rows, width, num_sms)
    if parts is None:
        return "three launches", topk_config(rows, width, k, num_sms)
    return ("one launch", parts, *slices(width, parts))


def _pdl(device: torch.device) -> dict:
    """Launch options for programmatic dependent launch (Hopper on): each launch may start while
    the one before it drains, and waits for it (gdc_wait) before reading what it wrote. 0-6% in
    CUDA graphs on the H200 (docs/PERFORMANCE.md). The one-launch top-k does not take it:
    kernels/topk_cooperative._launch_options says why."""
    on = device.type == "cuda" and not INTERPRET and torch.cuda.get_device_capability(device)[0] >= 9
    return dict(PDL=on, launch_pdl=True) if on else dict(PDL=False)


@triton.jit
def _scatter(ptr, value, mask):
    """tl.store(ptr, value, mask=mask) for 32-bit values at scattered addresses, one st.global an
    element in the operands' own layout. Triton lays a store it cannot prove contiguous out one
    element a thread and moves its pointers, values and mask there through shared memory: for a
    slice of 8192 keys that took longer than the stores themselves."""
    if STORE_IN_PLACE:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; } mov.b32 $0, 0;", "=r,l,r,r",
            [ptr, value, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:  # the interpreter has no inline assembly
        tl.store(ptr, value, mask=mask)


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
def _add_max_min(count_a, max_a, min_a, count_b, max_b, min_b):
    return count_a + count_b, tl.maximum(max_a, max_b), tl.minimum(min_a, min_b)


@triton.jit
def _take_digit(hist, prefix, need, STEP: tl.constexpr):
    """Digit STEP of the need-th largest key: prefix extended by it, need less the keys above it,
    and how many keys share the extended prefix."""
    at_or_above = tl.cumsum(hist, axis=0, reverse=True)
    # at_or_above falls as the digit grows (bin 0 holds every live key, >= need): the digit is the
    # last bin still reaching need, the keys above it the largest count short of need, the keys at
    # or above it the smallest count reaching need. One scan and one reduction, as each costs a
    # round of barriers across the program's warps.
    reaches = at_or_above >= need
    reach, above, at_digit = tl.reduce((tl.where(reaches, 1, 0), tl.where(reaches, 0, at_or_above),
                                        tl.where(reaches, at_or_above, 0x7FFFFFFF)), 0, _add_max_min)
    lo = 32 - RADIX * (STEP + 1) if 32 > RADIX * (STEP + 1) else 0
    return prefix | ((reach - 1).to(tl.uint32) << lo), need - above, at_digit - above


@triton.jit
def _kth_pairwise(key, sharing, n_sharing, need, scratch, PAIR_CAP: tl.constexpr):
    """The need-th largest of the (at most PAIR_CAP) keys flagged `sharing`, and how many of the
    keys equal to it are still needed: the keys are packed into scratch, then compared pairwise."""
    packed = tl.cumsum(sharing.to(tl.int32), axis=0) - 1
    _scatter(scratch + packed, key.to(tl.int32, bitcast=True), sharing)
    tl.debug_barrier()  # every warp's keys are in scratch (a block barrier orders global memory too)
    j = tl.arange(0, PAIR_CAP)
    ok = j < n_sharing
    few = tl.load(scratch + j, mask=ok, other=0).to(tl.uint32, bitcast=True)
    at_or_above = tl.sum((ok[None, :] & (few[None, :] >= few[:, None])).to(tl.int32), axis=1)
    # the keys with need or more keys at or above them are those up to the need-th largest
    thr = tl.max(tl.where(ok & (at_or_above >= need), few, 0), axis=0)
    return thr, need - tl.sum((ok & (few > thr)).to(tl.int32), axis=0)


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
        t0, target, _ = _take_digit(_digit_hist(key, live, t0, step), t0, target, step)
    return t0


@triton.jit
def _threshold_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, t0_ptr, count_ptr,
    K: tl.constexpr, SAMPLE: tl.constexpr, HAS_STARTS: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()  # the candidates launch may start now; it waits for this one
        gdc_wait()  # launched early (programmatic dependent launch): the logits' writer must be done
    row = tl.program_id(0)
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    tl.store(count_ptr + row, 0)  # the candidates launch counts from here: no memset of its own
    if length > K:
        tl.store(t0_ptr + row, _sample_threshold(base, length, K, SAMPLE).to(tl.int32, bitcast=True))


@triton.jit
def _candidates_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, t0_ptr, count_ptr, cand_ptr, runs_ptr,
    K: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr, HAS_STARTS: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the threshold launch is done: t0 and the zeroed counter are in place
    row = tl.program_id(0)
    block = tl.program_id(1)
    pos = block * BLOCK + tl.arange(0, BLOCK)
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    if (length > K) & (block * BLOCK < length):
        t0 = _scalar(tl.load(t0_ptr + row)).to(tl.uint32, bitcast=True)
        live = pos < length
        # the row's last full read: evict_first hands back the L2 lines the indexer stored evict_last
        x = tl.load(base + pos, mask=live, other=0.0, eviction_policy="evict_first")
        hit = (live & (_ordered_key(x) >= t0)).to(tl.int32)
        hits = tl.sum(hit, axis=0)
        if hits > 0:
            # one atomic per block: its hits form one run of the list, in position order
            first = tl.atomic_add(count_ptr + row, hits, sem="relaxed")  # the select reads after this launch
            tl.store(runs_ptr + row.to(tl.int64) * BLOCKS + block, first)
            slot = first + tl.cumsum(hit, axis=0) - 1
            # the counter keeps counting past CAP, which is how select sees the overflow
            tl.store(cand_ptr + row.to(tl.int64) * CAP + slot, pos, mask=(hit > 0) & (slot < CAP))


@triton.jit
def _items(base, listed_pos, i, n_items, n_listed):
    """Keys and positions of items i: candidates (listed_pos) below n_listed, the row's own positions above."""
    live = i < n_items
    pos = tl.where(i < n_listed, listed_pos, i)
    return _ordered_key(tl.load(base + pos, mask=live, other=0.0)), live, pos


@triton.jit
def _load_items(base, cand, i, n_items, n_listed):
    return _items(base, tl.load(cand + i, mask=i < n_listed, other=0), i, n_items, n_listed)


@triton.jit
def _block_counts(key, live, pos, thr, above, ties, BLOCK, BLOCKS: tl.constexpr):
    """Per key block, add the items above the threshold key and those equal to it (one histogram
    whose bin pairs are (above, tie) per block)."""
    bin = (pos // BLOCK).to(tl.int32) * 2 + (key == thr).to(tl.int32)
    pairs = tl.reshape(tl.histogram(bin, 2 * BLOCKS, mask=live & (key >= thr)), (BLOCKS, 2))
    more_above, more_ties = tl.split(pairs)
    return above + more_above, ties + more_ties


@triton.jit
def _before_run(first, count):
    """Per block, the sum of `count` over the blocks whose list run starts before its own."""
    return tl.sum(tl.where(first[None, :] < first[:, None], count[None, :], 0), axis=1)


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
def _run_starts(runs_ptr, n_listed, KEY_BLOCK, BLOCKS: tl.constexpr):
    """Where each key block's run starts in the list; in the whole-row search the list is the row
    itself, block b starting at b * KEY_BLOCK. A block that listed nothing left its entry unset,
    which is harmless: it has no items, and its count of zero weighs nothing in _before_run."""
    blocks = tl.arange(0, BLOCKS)
    listed = (blocks * 0 + n_listed) > 0
    return tl.where(listed, tl.load(runs_ptr + blocks, mask=listed, other=0), blocks * KEY_BLOCK)


@triton.jit
def _shifts(above, ties, need, first):
    """Per key block b, what _write_items adds to an item's rank in the list: to a tie's, the ties
    of earlier blocks (by position) less those listed before b's run; to a taken item's, the items
    taken from earlier blocks less those listed before b's run."""
    ties_before = tl.cumsum(ties, axis=0) - ties
    taken = above + tl.minimum(tl.maximum(need - ties_before, 0), ties)
    return ties_before - _before_run(first, ties), tl.cumsum(taken, axis=0) - taken - _before_run(first, taken)


@triton.jit
def _write_items(key, live, pos, val, thr, need, tie_shift, slot_shift, ties_seen, taken_seen, BLOCK, out_row):
    """Write the selected items among these (the next ones of the list; val: their transformed
    positions) to their output slots.

    ties_seen / taken_seen: ties and selected items earlier in the list. A block's items are one
    run of the list in position order, so an item's rank within its block is its rank in the list
    less the count before the block's run; tie_shift / slot_shift (_shifts) fold that in with the
    block's rank over the whole row."""
    block = tl.where(live, pos // BLOCK, 0).to(tl.int32)
    tie = (live & (key == thr)).to(tl.int32)
    tie_rank = ties_seen + tl.cumsum(tie, axis=0) - tie + tl.gather(tie_shift, block, 0)
    take = (live & (key > thr)) | ((tie > 0) & (tie_rank < need))
    taken = take.to(tl.int32)
    slot = taken_seen + tl.cumsum(taken, axis=0) - taken + tl.gather(slot_shift, block, 0)
    _scatter(out_row + slot, val.to(tl.int32), take)
    return ties_seen + tl.sum(tie, axis=0), taken_seen + tl.sum(taken, axis=0)


@triton.jit(do_not_specialize=["stride_bt"])  # kernels/specialization.py
def _select_write_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, count_ptr, cand_ptr, runs_ptr, scratch_ptr, out_ptr, stride_out,
    bt_ptr, stride_bt, offs_ptr, NEXT_N, KEY_BLOCK,
    K: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr, PAIR_CAP: tl.constexpr,
    HAS_STARTS: tl.constexpr, PAGE: tl.constexpr, TRANSFORM: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()  # the candidates launch is done
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    # Three loads that do not depend on each other, issued together: the row's length, its
    # candidate count and the first block of its list (cap >= BLOCK; entries past the count unused).
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    n_cand = _scalar(tl.load(count_ptr + row))
    cand = cand_ptr + row.to(tl.int64) * CAP
    listed_pos = tl.load(cand + offs)
    out_row = out_ptr + row.to(tl.int64) * stride_out
    scratch = scratch_ptr + row.to(tl.int64) * PAIR_CAP
    if length <= K:  # dense: every position, then -1
        for c in range(0, K, BLOCK):
            pos = c + offs
            val = _transform(tl.where(pos < length, pos, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
            tl.store(out_row + pos, val.to(tl.int32), mask=pos < K)
    else:
        whole_row = (n_cand < K) | (n_cand > CAP)
        n_items = tl.where(whole_row, length, n_cand)
        n_listed = tl.where(whole_row, 0, n_cand)
        # After each step `thr` holds more leading bits of the k-th largest key and `need` how many
        # keys sharing them still belong to the top k; at the end, how many ties to take.
        thr = tl.zeros((), tl.uint32)
        need = tl.zeros((), tl.int32) + K
        above = tl.zeros((BLOCKS,), tl.int32)
        ties = tl.zeros((BLOCKS,), tl.int32)
        first = _run_starts(runs_ptr + row.to(tl.int64) * BLOCKS, n_listed, KEY_BLOCK, BLOCKS)
        if n_items <= BLOCK:
            # The usual case: the candidates fit one block, so they are gathered once and every
            # digit is resolved in registers instead of re-gathering them per digit. Their
            # block-table lookups are issued now, to overlap the digit steps.
            key, live, pos = _items(base, listed_pos, offs, n_items, n_listed)
            val = _transform(pos, row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
            # Keys relative to the smallest, their span's top bit moved to bit 31: ceil(bits / 6)
            # digit steps resolve them (four on random-normal candidates, whose span is ~24 bits).
            key = tl.where(live, key - tl.min(tl.where(live, key, tl.full((BLOCK,), 0xFFFFFFFF, tl.uint32)), axis=0), 0)
            span = tl.max(key, axis=0)
            # bit length from the float's exponent; rounding up to a power of two only adds a bit
            bits = (span.to(tl.float32).to(tl.uint32, bitcast=True) >> 23).to(tl.int32) - 126
            bits = tl.where(span > 0, tl.minimum(bits, 32), 0)
            key = key << tl.where(span > 0, 32 - bits, 0).to(tl.uint32)
            # Once few enough keys share the digits found so far, they are compared pairwise instead
            # of taking the remaining steps: on random rows of 32K-128K keys 100-380 keys share
            # the first digit and 1-13 the first two (a CPU simulation of these steps).
            found = False
            for step in tl.static_range((32 + RADIX - 1) // RADIX):
                if (RADIX * step < bits) & (not found):
                    thr, need, sharing = _take_digit(_digit_hist(key, live, thr, step), thr, need, step)
                    if sharing <= PAIR_CAP:
                        lo = 32 - RADIX * (step + 1) if 32 > RADIX * (step + 1) else 0
                        thr, need = _kth_pairwise(key, live & ((key >> lo) == (thr >> lo)), sharing, need, scratch,
                                                  PAIR_CAP)
                        found = True
            above, ties = _block_counts(key, live, pos, thr, above, ties, KEY_BLOCK, BLOCKS)
            tie_shift, slot_shift = _shifts(above, ties, need, first)
            _write_items(key, live, pos, val, thr, need, tie_shift, slot_shift, 0, 0, KEY_BLOCK, out_row)
        else:
            for step in tl.static_range((32 + RADIX - 1) // RADIX):
                hist = tl.zeros((BINS,), tl.int32)
                for c in range(0, n_items, BLOCK):
                    key, live, pos = _load_items(base, cand, c + offs, n_items, n_listed)
                    hist += _digit_hist(key, live, thr, step)
                thr, need, _ = _take_digit(hist, thr, need, step)
            for c in range(0, n_items, BLOCK):
                key, live, pos = _load_items(base, cand, c + offs, n_items, n_listed)
                above, ties = _block_counts(key, live, pos, thr, above, ties, KEY_BLOCK, BLOCKS)
            tie_shift, slot_shift = _shifts(above, ties, need, first)
            ties_seen = tl.zeros((), tl.int32)
            taken_seen = tl.zeros((), tl.int32)
            for c in range(0, n_items, BLOCK):
                key, live, pos = _load_items(base, cand, c + offs, n_items, n_listed)
                val = _transform(pos, row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
                ties_seen, taken_seen = _write_items(key, live, pos, val, thr, need, tie_shift, slot_shift,
                                                     ties_seen, taken_seen, KEY_BLOCK, out_row)


@dataclass
class CandidateLists:
    """Per row: how many candidates (count), their positions (cand [rows, cap]) and where each key
    block's run starts in the list (first [rows, bins]); the two launches before the select."""

    count: torch.Tensor
    cand: torch.Tensor
    first: torch.Tensor


def candidate_lists(logits, lengths, row_starts, k: int, cfg: TopkConfig, width: int | None = None) -> CandidateLists:
    """width: the widest range a row ranks (default: the logits' width)."""
    n, width = logits.shape[0], width or logits.shape[1]
    bins = max(32, next_power_of_2(cdiv(width, cfg.block)))  # histograms want a warp multiple
    lists = CandidateLists(torch.empty(n, device=logits.device, dtype=torch.int32),
                           torch.empty(n, cfg.cap, device=logits.device, dtype=torch.int32),
                           torch.empty(n, bins, device=logits.device, dtype=torch.int32))
    t0 = torch.empty(n, device=logits.device, dtype=torch.int32)
    row_args = (logits, logits.stride(0), row_starts if row_starts is not None else lengths, lengths)
    common = dict(K=k, HAS_STARTS=row_starts is not None, **_pdl(logits.device))
    _threshold_kernel[(n,)](*row_args, t0, lists.count, SAMPLE=cfg.sample, num_warps=16, **common)
    _candidates_kernel[(n, max(1, cdiv(width, cfg.block)))](
        *row_args, t0, lists.count, lists.cand, lists.first, CAP=cfg.cap, BLOCK=cfg.block, BLOCKS=bins,
        num_warps=8 if cfg.block >= 4096 else 4, **common)
    return lists


def select_and_write(
    logits, lengths, row_starts, k: int, cfg: TopkConfig, lists: CandidateLists, out: torch.Tensor,
    transform: int, block_table, page_size: int, next_n: int, offsets,
) -> None:
    bt = block_table if block_table is not None else lengths
    scratch = torch.empty(logits.shape[0], cfg.pair_cap, device=logits.device, dtype=torch.int32)
    _select_write_kernel[(logits.shape[0],)](
        logits, logits.stride(0), row_starts if row_starts is not None else lengths, lengths,
        lists.count, lists.cand, lists.first, scratch, out, out.stride(0), bt,
        bt.stride(0) if block_table is not None else 0, offsets if offsets is not None else lengths, next_n, cfg.block,
        K=k, CAP=cfg.cap, BLOCK=cfg.select_block, BLOCKS=lists.first.shape[1], PAIR_CAP=cfg.pair_cap,
        HAS_STARTS=row_starts is not None, PAGE=page_size, TRANSFORM=transform,
        num_warps=16 if cfg.select_block >= 4096 else 4, **_pdl(logits.device),
    )


def topk_transform(
    logits: torch.Tensor, lengths: torch.Tensor, k: int, transform: int = TRANSFORM_NONE, *,
    row_starts: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
    page_size: int = 1, next_n: int = 1, offsets: torch.Tensor | None = None, config: TopkConfig | None = None,
    max_length: int | None = None,
) -> torch.Tensor:
    """logits [N, W] fp32, lengths [N] int32 -> [N, k] int32: positions, slots or ragged indices, -1 padded.

    Row i ranks logits[i, row_starts[i] : row_starts[i] + lengths[i]] (within W); argument checks
    live in kernels/dispatch.py. Without a `config`, grids small enough for kernels/topk_cooperative
    take its single launch; the rest take these three launches with topk_config for the shape.
    max_length, where the caller knows one, bounds every length: the launch is sized by it rather
    than by W. Rows of several requests' keys side by side (a prefill piece) are W = their sum
    wide, while a row ranks one request's keys.
    """
    n, width = logits.shape
    width = width if max_length is None else max(1, min(width, max_length))  # the widest range a row ranks
    out = torch.empty(n, k, device=logits.device, dtype=torch.int32)
    if n == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if config is None:
        from .topk_cooperative import cooperative_topk, parts_per_row

        parts = parts_per_row(n, width, num_sms(logits.device))
        if parts is not None and cooperative_topk(logits, lengths, row_starts, k, parts, out, transform, block_table,
                                                  page_size, next_n, offsets, width=width):
            return out
    cfg = config or topk_config(n, width, k, num_sms(logits.device))
    lists = candidate_lists(logits, lengths, row_starts, k, cfg, width)
    select_and_write(logits, lengths, row_starts, k, cfg, lists, out, transform, block_table, page_size, next_n,
                     offsets)
    return out

"""Exact top-k in one launch: a row's programs narrow down its k-th key together, meeting at
barriers in global memory.

At small batch the three-launch top-k (kernels/topk.py) is latency-bound: three dependent launches
and a select that resolves ~3K candidates in one program per row. Here each row is split across P
programs (rows x P at most the SM count, launched cooperatively, so all of them are resident at
once and may wait for each other), each holding its slice of the row in registers, up to 8192 keys.
Once rows pass half the SMs a row is one program, which waits for no other: those launches are
plain and take any number of rows of up to 32K keys. A program whose span of the row is longer
than a slice (up to four slices; on 132 SMs, rows of 32K keys from 64 rows on, 32 of 128K) reads
it a slice at a time and holds only its list (step 2, _streamed):

1. every program of the row reads the same strided sample of it and brackets the k-th key by
   value: the sample's keys ranked 3 binomial standard deviations either side of where the k-th
   key's rank falls in the sample, located to a 64th of the sample's span (_bracket). The first
   round splits the bracket 62 ways, with one bin below it and one above: ~30 keys of a normal 32K
   row then share the k-th key's bin;
2. each program lists the positions of its keys in the first round's bins above the lowest (those
   at or above the bracket, a tenth of a normal 32K row), in order, and reads their logits again
   through the list; every later step (histograms, gather, output) then works on the list, a
   quarter of the slice. A program whose keys do not fit, a row whose k-th key lies below the
   bracket, and rows shorter than 8 k go on over the slice. A streamed span lists up to a slice's
   worth of keys (its bracket reaches 4.5 standard deviations below the k-th key's rank, as
   another read of the span costs more than a wider list); a row where one of its lists overflows,
   or whose k-th key lies below the bracket, reads its spans again in every later step
   (_streamed_rounds);
3. rounds: each program histograms its live keys (those in the bins chosen so far) over the
   round's 64 bins and publishes the histogram; the row's programs meet; each reads all P and picks
   the bin holding the need-th largest live key. Up to three rounds by value (the bracket, then
   each splits the bin chosen before 64 ways; a k-th key outside the bracket goes on over the
   sample's span beyond it), then 6-bit digits of the key's ordered bits, then of the reversed
   position (keys are unique by then), until the chosen bin holds at most PAIR_CAP keys or exactly
   the keys still needed: one round on normal rows of 32K keys, sometimes two at 128K;
4. a bin of at most PAIR_CAP keys is gathered in position order (the programs meet once more) and
   ranked pairwise by key, then position, which gives the last key taken. Every program knows from
   the histograms and the gathered keys how many keys the programs before it take, so each writes
   its own in ascending position order with no further meeting.

The result equals kernels/reference.topk_positions_ref bit for bit: ties at the k-th key go to the
lowest positions, rows no longer than k return every position then -1.

Barriers: one counter per row (kernels/grid_barrier.py): each program adds 128 / P and waits for
the next multiple of 128. A row of one program meets only itself, at a block barrier. Under
TRITON_INTERPRET=1 programs run one after another, so P is 1 there. The counters are made outside
CUDA-graph captures: a graph captured on a stream before any top-k ran there eagerly takes the
three launches (grid_barrier.counters), so run one call on the capture stream first, as an
engine's warm-up does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import grid_barrier
from .host_math import cdiv, next_power_of_2
from .topk import _ordered_key, _row, _scatter, _transform
from .triton_dot import INTERPRET

BINS = tl.constexpr(64)
VALUE_ROUNDS = tl.constexpr(3)
PAIR_CAP = 64  # the most keys of the last bin ranked pairwise ([PAIR_CAP, PAIR_CAP] compares a program)
SAMPLE = 1024  # keys of the sample that places the first round's bins (_bracket)
MIN_SLICE, MAX_SLICE = 512, 8192  # keys a program holds (device_parts)
MAX_SPAN = 4 * MAX_SLICE  # keys a program reads, a slice at a time (_streamed)
MAX_PARTS = 128  # a meeting adds 128 / P per program (_meet)


@triton.jit
def _meet(counter, P: tl.constexpr):
    """Wait until the row's P programs have all arrived. The release / acquire pair orders every
    program's global stores before the loads of the others after the meeting, plain loads
    included: they may then be served from L1 (the acquire invalidates it), so the histograms and
    gathered keys that all of a program's threads read reach L2 once an SM instead of once a
    thread (H100: batch 2 / 64K 14.2 -> 10.6 us against loads that bypass L1). A row of one
    program meets only itself: the block barrier orders its threads' stores before their loads
    (H100: 128 / 32K 33.8 -> 30.8 us behind the indexer, two meetings of ~2000 cycles saved)."""
    tl.debug_barrier()  # every thread's stores come before the release below
    if P > 1:
        arrived = tl.atomic_add(counter, 128 // P, sem="acq_rel", scope="gpu")
        target = (arrived & -128) + 128
        while tl.atomic_add(counter, 0, sem="acquire", scope="gpu") - target < 0:
            pass
        tl.debug_barrier()


@triton.jit
def _add(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _count_max_min(n_a, above_a, at_a, above_mine_a, at_mine_a, n_b, above_b, at_b, above_mine_b, at_mine_b):
    return (n_a + n_b, tl.maximum(above_a, above_b), tl.minimum(at_a, at_b), tl.maximum(above_mine_a, above_mine_b),
            tl.minimum(at_mine_a, at_mine_b))


@triton.jit
def _pick_bin(hists, earlier, need):
    """From the row's histograms [P, BINS] (earlier: the rows of the programs before this one), the
    bin of the need-th largest live key: the bin, the keys above it and in it, and of those, the
    earlier programs' counts. One reduction, one scan and one reduction, as each costs a round of
    barriers across the program's warps."""
    total, mine = tl.reduce((hists, tl.where(earlier, hists, 0)), 0, _add)
    at_or_above, at_or_above_mine = tl.associative_scan((total, mine), 0, _add, reverse=True)
    # both fall as the bin grows; bin 0 holds every live key (>= need), the bin sought is the last reaching need
    reaches = at_or_above >= need
    n, above, at, above_mine, at_mine = tl.reduce(
        (reaches.to(tl.int32), tl.where(reaches, 0, at_or_above), tl.where(reaches, at_or_above, 0x7FFFFFFF),
         tl.where(reaches, 0, at_or_above_mine), tl.where(reaches, at_or_above_mine, 0x7FFFFFFF)), 0, _count_max_min)
    return n - 1, above, at - above, above_mine, at_mine - above_mine


@triton.jit
def _max_max_add(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), tl.maximum(a1, b1), a2 + b2


@triton.jit
def _before(flags, SLICE: tl.constexpr):
    """For each of the slice's flags, how many come before it (in position order). Taken in runs of
    4, the keys a thread holds side by side after _load_slice: a scan along the whole slice is
    laid out one key a thread by the scattered store that takes its result, and costs 3x the
    instructions."""
    f = tl.reshape(flags.to(tl.int32), [SLICE // 4, 4])
    run = tl.sum(f, axis=1)
    before = (tl.cumsum(run, axis=0) - run)[:, None] + tl.cumsum(f, axis=1) - f
    return tl.reshape(before, [SLICE])


@triton.jit
def _load_slice(base, pos, length):
    """The slice's logits. The mask stops at a multiple of 4 and the last few keys come as scalars,
    so that the compiler may load 4 keys a thread at once (over aligned rows), and every later
    step, scans included, works on runs of 4 keys in a thread instead of 1. The row's last full
    read: evict_first hands back the L2 lines the indexer stored evict_last."""
    whole = (length // 4) * 4
    x = tl.load(base + pos, mask=pos < whole, other=0.0, eviction_policy="evict_first")
    for i in tl.static_range(3):
        tail = whole + i
        x = tl.where(pos == tail, tl.load(base + tail, mask=tail < length, other=0.0), x)
    return x


@triton.jit
def _value_bins(x, lo, scale):
    """Bins by value, monotone in x whatever the rounding: keys outside [lo, lo + 64 / scale) go to
    the edge bins."""
    return tl.minimum(tl.maximum((x - lo) * scale, 0.0), BINS - 1.0).to(tl.int32)


@triton.jit
def _bracket(sample, lo, span, length, K: tl.constexpr, SAMPLE: tl.constexpr, SIGMAS_BELOW: tl.constexpr):
    """The first round's bracket (step 1 of the module docstring): its low end and width. A 32K
    row's k-th key then shares its bin with ~30 keys (the gather's share) instead of ~460 when the
    first round split the sample's whole span. It reaches 3 binomial standard deviations above the
    k-th key's rank in the sample and SIGMAS_BELOW below it."""
    scale = BINS / tl.maximum(span, 1e-30)
    hist = tl.histogram(_value_bins(sample, lo, scale), BINS)
    at_or_above = tl.cumsum(hist, axis=0, reverse=True)
    expect = (K * SAMPLE) / length.to(tl.float32)
    sigma = tl.sqrt(expect * (1.0 - expect / SAMPLE))
    above, below = 3.0 * sigma + 1.0, SIGMAS_BELOW * sigma + 1.0
    # the bin of the r-th largest sample key is the last bin with at least r keys at or above it
    top, bottom = tl.reduce(((at_or_above >= expect - above).to(tl.int32),
                             (at_or_above >= tl.minimum(expect + below, SAMPLE)).to(tl.int32)), 0, _add)
    low = lo + (bottom - 1).to(tl.float32) / scale
    return low, (top - bottom + 1).to(tl.float32) / scale


@triton.jit
def _first_round(base, length, K: tl.constexpr, SAMPLE: tl.constexpr, SIGMAS_BELOW: tl.constexpr):
    """The row's sample and the first round's bins by value (step 1 of the module docstring):
    whether rounds by value apply, the sample's extremes, the bracket, and the bins' low end and
    scale (bin 0 for the keys below the bracket, 63 for those above)."""
    sample = tl.load(base + (tl.arange(0, SAMPLE).to(tl.int64) * length) // SAMPLE)
    sample_lo = tl.min(sample, axis=0)
    sample_hi = tl.max(sample, axis=0)
    span = sample_hi - sample_lo
    # bins by value need a finite, positive span (no infinities in the sample, not one value)
    value_rounds = tl.where((span > 0.0) & (span < float("inf")), VALUE_ROUNDS, 0)
    bracket_lo, bracket_span = _bracket(sample, sample_lo, span, length, K, SAMPLE, SIGMAS_BELOW)
    scale = (BINS - 2) / bracket_span  # with value rounds, at least a 64th of the span
    return value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, bracket_lo - 1.0 / scale, scale


@triton.jit
def _second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span):
    """The second round's bins by value, after the first chose bin b."""
    if value_rounds > 0:
        if b == 0:  # below the bracket: down to the sample's low end
            lo = sample_lo
            scale = BINS / tl.maximum(bracket_lo - lo, 1e-30)
        elif b == BINS - 1:  # above it: up to the sample's high end
            lo = bracket_lo + bracket_span
            scale = BINS / tl.maximum(sample_hi - lo, 1e-30)
        else:
            lo += b.to(tl.float32) / scale
            scale *= BINS
    return lo, scale


@triton.jit
def _round_bins(x, pos, rnd, value_rounds, lo, scale):
    """The round's bin of each key: by value, then 6-bit digits from the top, six of the key's
    ordered bits then six of the reversed position (larger for lower positions, which take the ties
    at the k-th key), so the live keys end up distinct; a last digit's upper bits are already equal."""
    if rnd < value_rounds:
        bin = _value_bins(x, lo, scale)
    else:
        digit = rnd - value_rounds
        shift = tl.maximum(26 - 6 * (digit % 6), 0).to(tl.uint32)
        rev = (0x7FFFFFFF - pos).to(tl.uint32)
        bin = ((tl.where(digit < 6, _ordered_key(x), rev) >> shift) & (BINS - 1)).to(tl.int32)
    return bin


@triton.jit
def _read_list(lst, base, n_listed, length, first, lo, scale, SPAN: tl.constexpr, LIST: tl.constexpr):
    """The program's list read back after its stores: the positions, their logits and first-round
    bins, and the first round's histogram (the list's bins, the span's other keys in bin 0). The
    logits are read again (L1 / L2): storing them beside the positions spilled registers."""
    tl.debug_barrier()  # the program's stores before its loads
    at = tl.arange(0, LIST)
    in_list = at < n_listed
    lpos = tl.load(lst + at, mask=in_list, other=0)
    lx = tl.load(base + lpos, mask=in_list, other=0.0)
    lbin = tl.where(in_list, _value_bins(lx, lo, scale), 0)
    below = tl.minimum(tl.maximum(length - first, 0), SPAN) - n_listed
    hist = tl.histogram(lbin, BINS, mask=in_list) + tl.where(tl.arange(0, BINS) == 0, below, 0)
    return in_list, lpos, lx, lbin, hist


@triton.jit
def _exchange(hist, exch, rnd, counter, part, need, P: tl.constexpr):
    """Publish this program's histogram of the round, meet the row's programs and pick the bin
    (_pick_bin) from all P. Two buffers: a program can be at most one round ahead of another."""
    bins = tl.arange(0, BINS)
    parts = tl.arange(0, P)
    buf = exch + (rnd % 2) * (P * BINS)
    tl.store(buf + part * BINS + bins, hist)
    _meet(counter, P)
    hists = tl.load(buf + parts[:, None] * BINS + bins[None, :])
    return _pick_bin(hists, parts[:, None] < part, need)


@triton.jit
def _last_taken(gather, share, need, first, PAIR_CAP: tl.constexpr):
    """The row's last key taken (its ordered key and position), from the share <= PAIR_CAP live keys
    gathered in position order, ranked pairwise by key, then position; and how many of the live
    keys taken lie before this program's first position."""
    g = tl.arange(0, PAIR_CAP)
    ok = g < share
    gk = tl.load(gather + g, mask=ok, other=0).to(tl.uint32, bitcast=True)
    gp = tl.load(gather + PAIR_CAP + g, mask=ok, other=0)
    ahead = (gk[None, :] > gk[:, None]) | ((gk[None, :] == gk[:, None]) & (gp[None, :] < gp[:, None]))
    rank = tl.sum((ok[None, :] & ahead).to(tl.int32), axis=1)
    last_key = ok & (rank == need - 1)
    taken_earlier = (ok & (rank < need) & (gp < first)).to(tl.int32)
    return tl.reduce((tl.where(last_key, gk, 0), tl.where(last_key, gp, -1), taken_earlier), 0, _max_max_add)


@triton.jit
def _finish(
    x, pos, live, taken, need, above_before, share_before, share, value_rounds, lo, scale, part, first,
    exch, counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N,
    WIDTH: tl.constexpr, P: tl.constexpr, PAIR_CAP: tl.constexpr, PAGE: tl.constexpr, TRANSFORM: tl.constexpr,
):
    """Steps 3 and 4 of the module docstring after the first round, over this program's keys x at
    positions pos (its list or its slice): live keys are in every bin chosen so far, taken keys
    above one of them; need is how many live keys of the row still belong to the top k, share how
    many the row has, and above_before / share_before what the programs before this one take and
    hold live. Writes the program's share of the row's output."""
    rnd = tl.zeros((), tl.int32) + 1
    going = (share > PAIR_CAP) & (share > need)
    while going:
        bin = _round_bins(x, pos, rnd, value_rounds, lo, scale)
        b, above, share, above_earlier, share_before = _exchange(
            tl.histogram(bin, BINS, mask=live), exch, rnd, counter, part, need, P)
        above_before += above_earlier
        taken = taken | (live & (bin > b))
        live = live & (bin == b)
        need -= above
        if rnd < value_rounds:
            lo += b.to(tl.float32) / scale
            scale *= BINS
        rnd += 1
        going = (share > PAIR_CAP) & (share > need)
    key = _ordered_key(x)
    if share > need:
        # At most PAIR_CAP live keys left in the row: gathered in position order (the earlier
        # programs' live keys come first; the programs meet once more) and ranked pairwise by key,
        # then position; the need-th of them is the last key taken
        entry = share_before + _before(live, WIDTH)
        _scatter(gather + entry, key.to(tl.int32, bitcast=True), live)
        _scatter(gather + PAIR_CAP + entry, pos, live)
        _meet(counter, P)
        thr_key, thr_pos, chosen_before = _last_taken(gather, share, need, first, PAIR_CAP)
        pick = (key > thr_key) | ((key == thr_key) & (pos <= thr_pos))
    else:  # the live keys are exactly those still needed
        chosen_before = share_before
        pick = live
    take = taken | (live & pick)
    slot = above_before + chosen_before + _before(take, WIDTH)
    val = _transform(tl.where(take, pos, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
    _scatter(out_row + slot, val.to(tl.int32), take)


@triton.jit
def _chunk(base, first, c, length, SLICE: tl.constexpr):
    """Slice c of a streamed program's span: its logits and positions."""
    pos = first + c * SLICE + tl.arange(0, SLICE)
    return _load_slice(base, pos, length), pos


@triton.jit
def _decided(x, live, taken, lo, scale, b, nv, rnd: tl.constexpr):
    """Round rnd by value, if decided (nv rounds by value are): keys in bins above b are taken,
    those in b stay live."""
    bin = _value_bins(x, lo, scale)
    decided = nv > rnd
    return tl.where(decided, live & (bin == b), live), tl.where(decided, taken | (live & (bin > b)), taken)


@triton.jit
def _state(x, pos, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2, kmask, kpre, pmask, ppre):
    """Which keys of a chunk are still live and which are taken, from the rounds decided so far:
    up to three by value (nv of them), then digits of the ordered key and of the reversed position
    as masks and prefixes (the rounds take them from the top, so masked values order as the keys)."""
    live = pos < length
    taken = pos < 0
    live, taken = _decided(x, live, taken, lo0, sc0, b0, nv, 0)
    live, taken = _decided(x, live, taken, lo1, sc1, b1, nv, 1)
    live, taken = _decided(x, live, taken, lo2, sc2, b2, nv, 2)
    key = _ordered_key(x) & kmask
    taken = taken | (live & (key > kpre))
    live = live & (key == kpre)
    rev = (0x7FFFFFFF - pos).to(tl.uint32) & pmask
    taken = taken | (live & (rev > ppre))
    return live & (rev == ppre), taken


@triton.jit
def _chunk_state(base, first, c, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2, kmask, kpre, pmask, ppre,
                 SLICE: tl.constexpr):
    """Slice c of a streamed span (_chunk) and its keys' state (_state)."""
    x, pos = _chunk(base, first, c, length, SLICE)
    live, taken = _state(x, pos, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2, kmask, kpre, pmask, ppre)
    return x, pos, live, taken


@triton.jit
def _streamed_rounds(
    base, length, first, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo, scale, part, exch,
    counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N,
    K: tl.constexpr, P: tl.constexpr, SLICE: tl.constexpr, CHUNKS: tl.constexpr, PAIR_CAP: tl.constexpr,
    PAGE: tl.constexpr, TRANSFORM: tl.constexpr,
):
    """Steps 3 and 4 of the module docstring from the first round on, for a streamed span whose row
    the list does not serve: every round reads the span again, slice by slice, and works out each
    key's state from the rounds decided so far (_state)."""
    nv = tl.zeros((), tl.int32)  # rounds by value decided; the bins of the others are not read
    lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2 = lo, scale, nv, lo, scale, nv, lo, scale, nv
    kmask, kpre, pmask, ppre = nv.to(tl.uint32), nv.to(tl.uint32), nv.to(tl.uint32), nv.to(tl.uint32)
    need = tl.zeros((), tl.int32) + K
    above_before = tl.zeros((), tl.int32)
    rnd = tl.zeros((), tl.int32)
    share, share_before = rnd, rnd  # (set by every round)
    going = rnd == 0
    while going:
        hist = tl.zeros((BINS,), tl.int32)
        for c in range(CHUNKS):
            x, pos, live, taken = _chunk_state(base, first, c, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2,
                                               kmask, kpre, pmask, ppre, SLICE)
            hist += tl.histogram(_round_bins(x, pos, rnd, value_rounds, lo, scale), BINS, mask=live)
        # exchange 0 was the list's: the rounds here take 1, 2, ...
        b, above, share, above_earlier, share_before = _exchange(hist, exch, rnd + 1, counter, part, need, P)
        above_before += above_earlier
        need -= above
        if rnd < value_rounds:
            lo0, sc0, b0 = tl.where(rnd == 0, lo, lo0), tl.where(rnd == 0, scale, sc0), tl.where(rnd == 0, b, b0)
            lo1, sc1, b1 = tl.where(rnd == 1, lo, lo1), tl.where(rnd == 1, scale, sc1), tl.where(rnd == 1, b, b1)
            lo2, sc2, b2 = tl.where(rnd == 2, lo, lo2), tl.where(rnd == 2, scale, sc2), tl.where(rnd == 2, b, b2)
            nv += 1
            if rnd == 0:
                lo, scale = _second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span)
            else:
                lo += b.to(tl.float32) / scale
                scale *= BINS
        else:
            digit = rnd - value_rounds
            shift = tl.maximum(26 - 6 * (digit % 6), 0).to(tl.uint32)
            if digit < 6:
                kmask |= (BINS - 1) << shift
                kpre |= b.to(tl.uint32) << shift
            else:
                pmask |= (BINS - 1) << shift
                ppre |= b.to(tl.uint32) << shift
        rnd += 1
        going = (share > PAIR_CAP) & (share > need)
    # the last key taken: as _finish does, from the at most PAIR_CAP live keys gathered in position order
    thr_key = tl.zeros((), tl.uint32)
    thr_pos = tl.zeros((), tl.int32) + 0x7FFFFFFF
    chosen_before = share_before
    if share > need:
        listed = tl.zeros((), tl.int32)
        for c in range(CHUNKS):
            x, pos, live, taken = _chunk_state(base, first, c, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2,
                                               kmask, kpre, pmask, ppre, SLICE)
            entry = share_before + listed + _before(live, SLICE)
            _scatter(gather + entry, _ordered_key(x).to(tl.int32, bitcast=True), live)
            _scatter(gather + PAIR_CAP + entry, pos, live)
            listed += tl.sum(live.to(tl.int32), axis=0)
        _meet(counter, P)
        thr_key, thr_pos, chosen_before = _last_taken(gather, share, need, first, PAIR_CAP)
    written = above_before + chosen_before
    for c in range(CHUNKS):
        x, pos, live, taken = _chunk_state(base, first, c, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2, kmask,
                                           kpre, pmask, ppre, SLICE)
        key = _ordered_key(x)
        take = taken | (live & ((key > thr_key) | ((key == thr_key) & (pos <= thr_pos))))
        val = _transform(tl.where(take, pos, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
        _scatter(out_row + written + _before(take, SLICE), val.to(tl.int32), take)
        written += tl.sum(take.to(tl.int32), axis=0)


@triton.jit
def _streamed(
    base, length, part, counter, exch, gather, lst, flags, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N,
    K: tl.constexpr, P: tl.constexpr, SLICE: tl.constexpr, CHUNKS: tl.constexpr, SAMPLE: tl.constexpr,
    PAIR_CAP: tl.constexpr, PAGE: tl.constexpr, TRANSFORM: tl.constexpr,
):
    """A program whose span (CHUNKS slices) is more than its registers hold: it reads the span once,
    slice by slice, listing the keys at or above the bracket (up to a slice's worth), and goes on
    over the list as the one-slice programs do. A row where some program's list overflows, whose
    k-th key lies below the bracket, or without rounds by value goes on over its spans instead
    (_streamed_rounds)."""
    first = part * (SLICE * CHUNKS)
    # a k-th key below the bracket costs a streamed span several more reads (_streamed_rounds), so
    # the bracket reaches further down: 4.5 standard deviations miss ~3e-6 of normal rows, not 1e-3
    value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo, scale = _first_round(base, length, K, SAMPLE,
                                                                                           4.5)
    # two calls of _streamed_rounds: one after both branches makes a smaller kernel that spills (sm_90)
    if value_rounds > 0:  # the same in every program of the row, as b and the overflow below
        n_listed = tl.zeros((), tl.int32)
        for c in range(CHUNKS):
            x, pos = _chunk(base, first, c, length, SLICE)
            listed = (pos < length) & (_value_bins(x, lo, scale) > 0)
            entry = n_listed + _before(listed, SLICE)
            _scatter(lst + entry, pos, listed & (entry < SLICE))
            n_listed += tl.sum(listed.to(tl.int32), axis=0)
        tl.store(flags + part, (n_listed > SLICE).to(tl.int32))
        in_list, lpos, lx, lbin, hist = _read_list(lst, base, n_listed, length, first, lo, scale, SLICE * CHUNKS,
                                                   SLICE)
        b, above, share, above_before, share_before = _exchange(hist, exch, 0, counter, part, K, P)
        overflow = tl.max(tl.load(flags + tl.arange(0, P)), axis=0)  # ordered by the meeting, as the histograms
        if (b > 0) & (overflow == 0):
            lo2, scale2 = _second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span)
            _finish(lx, lpos, in_list & (lbin == b), in_list & (lbin > b), K - above, above_before, share_before,
                    share, value_rounds, lo2, scale2, part, first, exch, counter, gather, row, out_row, bt_ptr,
                    stride_bt, offs_ptr, NEXT_N, SLICE, P, PAIR_CAP, PAGE, TRANSFORM)
        else:
            _streamed_rounds(base, length, first, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo,
                             scale, part, exch, counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N, K,
                             P, SLICE, CHUNKS, PAIR_CAP, PAGE, TRANSFORM)
    else:
        _streamed_rounds(base, length, first, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo, scale,
                         part, exch, counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N, K, P, SLICE,
                         CHUNKS, PAIR_CAP, PAGE, TRANSFORM)


@triton.jit
def _topk_kernel(
    logits_ptr, stride_logits, starts_ptr, lens_ptr, counters, exch_ptr, gather_ptr, list_ptr, flags_ptr, out_ptr,
    stride_out, bt_ptr, stride_bt, offs_ptr, NEXT_N,
    K: tl.constexpr, P: tl.constexpr, SLICE: tl.constexpr, CHUNKS: tl.constexpr, SAMPLE: tl.constexpr,
    PAIR_CAP: tl.constexpr, HAS_STARTS: tl.constexpr, PAGE: tl.constexpr, TRANSFORM: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    length, base = _row(logits_ptr, stride_logits, starts_ptr, lens_ptr, row, HAS_STARTS)
    out_row = out_ptr + row.to(tl.int64) * stride_out
    if length <= K:  # dense: every position, then -1; the row's programs share the slots
        for c in range(part * SLICE, K, P * SLICE):
            slot = c + tl.arange(0, SLICE)
            val = _transform(tl.where(slot < length, slot, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE,
                             TRANSFORM)
            tl.store(out_row + slot, val.to(tl.int32), mask=slot < K)
    elif CHUNKS > 1:
        _streamed(base, length, part, counters + row, exch_ptr + row.to(tl.int64) * (2 * P * BINS),
                  gather_ptr + row.to(tl.int64) * (2 * PAIR_CAP), list_ptr + (row * P + part).to(tl.int64) * SLICE,
                  flags_ptr + row * P, row, out_row, bt_ptr, stride_bt, offs_ptr, NEXT_N, K, P, SLICE, CHUNKS, SAMPLE,
                  PAIR_CAP, PAGE, TRANSFORM)
    else:
        first = part * SLICE
        pos = first + tl.arange(0, SLICE)
        live = pos < length
        x = _load_slice(base, pos, length)
        value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo, scale = _first_round(base, length, K, SAMPLE,
                                                                                               3.0)
        exch = exch_ptr + row.to(tl.int64) * (2 * P * BINS)
        gather = gather_ptr + row.to(tl.int64) * (2 * PAIR_CAP)  # keys, then positions
        counter = counters + row
        bin = _round_bins(x, pos, 0, value_rounds, lo, scale)
        # The list (step 2 of the module docstring); rows shorter than 8 k would list over a quarter
        # of their keys, so they go on over the slice
        LIST: tl.constexpr = SLICE // 4
        listed = live & (bin > 0)
        n_listed = tl.zeros((), tl.int32)
        on_list = (value_rounds > 0) & (K * 8 <= length)
        if on_list:
            n_listed = tl.sum(listed.to(tl.int32), axis=0)
            on_list = n_listed <= LIST
        at = tl.arange(0, LIST)
        if on_list:
            lst = list_ptr + (row * P + part).to(tl.int64) * LIST
            _scatter(lst + _before(listed, SLICE), pos, listed)
            in_list, lpos, lx, lbin, hist = _read_list(lst, base, n_listed, length, first, lo, scale, SLICE, LIST)
        else:  # (the list's tensors go unused)
            in_list = at < 0
            lpos = at
            lx = at.to(tl.float32)
            lbin = at
            hist = tl.histogram(bin, BINS, mask=live)
        b, above, share, above_before, share_before = _exchange(hist, exch, 0, counter, part, K, P)
        need = K - above
        lo, scale = _second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span)
        if on_list & (b > 0):  # the live and taken keys are all on the list
            _finish(lx, lpos, in_list & (lbin == b), in_list & (lbin > b), need, above_before, share_before, share,
                    value_rounds, lo, scale, part, first, exch, counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr,
                    NEXT_N, LIST, P, PAIR_CAP, PAGE, TRANSFORM)
        else:
            _finish(x, pos, live & (bin == b), live & (bin > b), need, above_before, share_before, share,
                    value_rounds, lo, scale, part, first, exch, counter, gather, row, out_row, bt_ptr, stride_bt, offs_ptr,
                    NEXT_N, SLICE, P, PAIR_CAP, PAGE, TRANSFORM)


def parts_per_row(rows: int, width: int, num_sms: int) -> int | None:
    """Programs per row, or None where this kernel does not serve (the three-launch top-k does).
    Under the interpreter 1: it runs programs one after another, so they could not meet."""
    if INTERPRET:
        return 1 if width <= MAX_SPAN else None
    return device_parts(rows, width, num_sms)


def device_parts(rows: int, width: int, num_sms: int) -> int | None:
    """A row's programs wait for each other, so rows x parts must fit the SMs at once: the most
    parts (a power of two) that do, while a part holds at least MIN_SLICE keys; one part when none
    do, at any number of rows; None when a part's span would exceed MAX_SPAN. From the H100 sweeps
    in docs/PERFORMANCE.md: more, smaller parts win as long as they fit (batch 1 / 32K: 12.1 us at
    64 parts, 24.4 at 4); spans of two to four slices, streamed, beat the three launches behind
    the indexer (128 / 32K 34 against 45 us, 32 / 128K 41 against 52), and so do rows of one
    program past the SM count (256 / 32K 63 against 82 us, 256 / 4K 22 against 55, 1024 / 4K 78
    against 149); spans of 16 slices were faster too on rows the list serves (128 / 128K: 81
    against 106), but a row whose k-th key misses the bracket read its span five more times (0.48
    ms)."""
    parts = 1
    while rows * parts * 2 <= num_sms and width >= parts * 2 * MIN_SLICE and parts < MAX_PARTS:
        parts *= 2
    # a row of one program waits for no other, so those rows need not fit the SMs at once
    return parts if (parts == 1 or rows * parts <= num_sms) and cdiv(width, parts) <= MAX_SPAN else None


_KERNEL = "the one-launch top-k"


def cooperative_topk(
    logits, lengths, row_starts, k: int, parts: int, out: torch.Tensor, transform: int, block_table, page_size: int,
    next_n: int, offsets, max_slice: int = MAX_SLICE,
) -> bool:
    """Arguments as kernels/topk.topk_transform, parts from parts_per_row; False (nothing written)
    when the driver refuses the grid as a cooperative launch, e.g. an MPS client given fewer SMs
    than the device has, or inside a capture with no barrier counters yet (grid_barrier.counters): the
    caller then takes the three launches. A program holds up to max_slice keys at once and streams
    a longer span (tests stream small rows with a small one)."""
    n, width = logits.shape
    if parts > 1 and grid_barrier.refused(_KERNEL, logits.device, n * parts):
        return False
    # one-program rows meet no other
    counters = grid_barrier.counters(logits.device, n, _KERNEL, "the three launches") if parts > 1 else lengths
    if counters is None:
        return False
    span = max(next_power_of_2(cdiv(width, parts)), 256)
    slice_ = min(span, max_slice)
    chunks = span // slice_
    exch = torch.empty(n, 2, parts, BINS.value, device=logits.device, dtype=torch.int32)
    # a streamed program lists up to a slice of keys, a one-slice program a quarter of it
    lists = torch.empty(n, parts, slice_ if chunks > 1 else slice_ // 4, device=logits.device, dtype=torch.int32)
    flags = torch.empty(n, parts, device=logits.device, dtype=torch.int32)
    gather = torch.empty(n, 2 * PAIR_CAP, device=logits.device, dtype=torch.int32)
    bt = block_table if block_table is not None else lengths
    try:
        _topk_kernel[(n, parts)](
            logits, logits.stride(0), row_starts if row_starts is not None else lengths, lengths,
            counters,
            exch, gather, lists, flags, out, out.stride(0), bt,
            bt.stride(0) if block_table is not None else 0, offsets if offsets is not None else lengths, next_n,
            K=k, P=parts, SLICE=slice_, CHUNKS=chunks, SAMPLE=SAMPLE, PAIR_CAP=PAIR_CAP,
            HAS_STARTS=row_starts is not None, PAGE=page_size, TRANSFORM=transform, num_warps=_warps(slice_),
            **_launch_options(logits.device, parts),
        )
    except RuntimeError as exc:
        if not grid_barrier.is_refusal(exc):
            raise
        grid_barrier.refuse(_KERNEL, logits.device, n * parts)
        return False
    return True


def _warps(slice_: int) -> int:
    """16 warps from 4096 keys a program (8 would take 194 registers a thread there), 4 at 512 (H100:
    8.5 against 9.7 us at batch 1 / 32K; at 1024 keys 4 warps lost 13% at batch 32 / 4K)."""
    return 16 if slice_ >= 4096 else 8 if slice_ >= 1024 else 4


def _launch_options(device: torch.device, parts: int) -> dict:
    """A cooperative launch where a row has several programs: the driver then refuses a grid whose
    programs cannot all be resident at once instead of letting its barriers wait forever. Not a
    programmatic dependent launch, as the three launches are: behind the indexer, the top-k launched
    early took 0.1-0.9 us longer than launched after it, at every shape this kernel serves (H100,
    docs/PERFORMANCE.md, "The one launch after the indexer, not early"); only back to back with
    itself did it gain."""
    return {} if device.type != "cuda" or INTERPRET or parts == 1 else dict(launch_cooperative_grid=True)

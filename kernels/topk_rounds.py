"""The steps a row's programs take together in the one-launch top-k (kernels/topk_cooperative.py, whose
docstring tells the algorithm): meeting, the sample's bracket, each round's bins and the
histograms exchanged between the row's programs, the list of keys above the bracket, and the last
bin ranked pairwise before every program writes its keys."""

from __future__ import annotations

import triton
import triton.language as tl

from .topk import _ordered_key, _scatter, _transform

BINS = tl.constexpr(64)
VALUE_ROUNDS = tl.constexpr(3)


@triton.jit
def meet(counter, P: tl.constexpr):
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
def pick_bin(hists, earlier, need):
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
def before(flags, SLICE: tl.constexpr):
    """For each of the slice's flags, how many come before it (in position order). Taken in runs of
    4, the keys a thread holds side by side after load_slice: a scan along the whole slice is
    laid out one key a thread by the scattered store that takes its result, and costs 3x the
    instructions."""
    f = tl.reshape(flags.to(tl.int32), [SLICE // 4, 4])
    run = tl.sum(f, axis=1)
    before = (tl.cumsum(run, axis=0) - run)[:, None] + tl.cumsum(f, axis=1) - f
    return tl.reshape(before, [SLICE])


@triton.jit
def load_slice(base, pos, length):
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
def value_bins(x, lo, scale):
    """Bins by value, monotone in x whatever the rounding: keys outside [lo, lo + 64 / scale) go to
    the edge bins."""
    return tl.minimum(tl.maximum((x - lo) * scale, 0.0), BINS - 1.0).to(tl.int32)


@triton.jit
def bracket(sample, lo, span, length, K: tl.constexpr, SAMPLE: tl.constexpr, SIGMAS_BELOW: tl.constexpr):
    """The first round's bracket (step 1 of the module docstring): its low end and width. A 32K
    row's k-th key then shares its bin with ~30 keys (the gather's share) instead of ~460 when the
    first round split the sample's whole span. It reaches 3 binomial standard deviations above the
    k-th key's rank in the sample and SIGMAS_BELOW below it."""
    scale = BINS / tl.maximum(span, 1e-30)
    hist = tl.histogram(value_bins(sample, lo, scale), BINS)
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
def first_round(base, length, K: tl.constexpr, SAMPLE: tl.constexpr, SIGMAS_BELOW: tl.constexpr):
    """The row's sample and the first round's bins by value (step 1 of the module docstring):
    whether rounds by value apply, the sample's extremes, the bracket, and the bins' low end and
    scale (bin 0 for the keys below the bracket, 63 for those above)."""
    sample = tl.load(base + (tl.arange(0, SAMPLE).to(tl.int64) * length) // SAMPLE)
    sample_lo = tl.min(sample, axis=0)
    sample_hi = tl.max(sample, axis=0)
    span = sample_hi - sample_lo
    # bins by value need a finite, positive span (no infinities in the sample, not one value)
    value_rounds = tl.where((span > 0.0) & (span < float("inf")), VALUE_ROUNDS, 0)
    bracket_lo, bracket_span = bracket(sample, sample_lo, span, length, K, SAMPLE, SIGMAS_BELOW)
    scale = (BINS - 2) / bracket_span  # with value rounds, at least a 64th of the span
    return value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, bracket_lo - 1.0 / scale, scale


@triton.jit
def second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span):
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
def round_bins(x, pos, rnd, value_rounds, lo, scale):
    """The round's bin of each key: by value, then 6-bit digits from the top, six of the key's
    ordered bits then six of the reversed position (larger for lower positions, which take the ties
    at the k-th key), so the live keys end up distinct; a last digit's upper bits are already equal."""
    if rnd < value_rounds:
        bin = value_bins(x, lo, scale)
    else:
        digit = rnd - value_rounds
        shift = tl.maximum(26 - 6 * (digit % 6), 0).to(tl.uint32)
        rev = (0x7FFFFFFF - pos).to(tl.uint32)
        bin = ((tl.where(digit < 6, _ordered_key(x), rev) >> shift) & (BINS - 1)).to(tl.int32)
    return bin


@triton.jit
def read_list(lst, base, n_listed, length, first, lo, scale, SPAN: tl.constexpr, LIST: tl.constexpr):
    """The program's list read back after its stores: the positions, their logits and first-round
    bins, and the first round's histogram (the list's bins, the span's other keys in bin 0). The
    logits are read again (L1 / L2): storing them beside the positions spilled registers."""
    tl.debug_barrier()  # the program's stores before its loads
    at = tl.arange(0, LIST)
    in_list = at < n_listed
    lpos = tl.load(lst + at, mask=in_list, other=0)
    lx = tl.load(base + lpos, mask=in_list, other=0.0)
    lbin = tl.where(in_list, value_bins(lx, lo, scale), 0)
    below = tl.minimum(tl.maximum(length - first, 0), SPAN) - n_listed
    hist = tl.histogram(lbin, BINS, mask=in_list) + tl.where(tl.arange(0, BINS) == 0, below, 0)
    return in_list, lpos, lx, lbin, hist


@triton.jit
def exchange(hist, exch, rnd, counter, part, need, P: tl.constexpr):
    """Publish this program's histogram of the round, meet the row's programs and pick the bin
    (pick_bin) from all P. Two buffers: a program can be at most one round ahead of another."""
    bins = tl.arange(0, BINS)
    parts = tl.arange(0, P)
    buf = exch + (rnd % 2) * (P * BINS)
    tl.store(buf + part * BINS + bins, hist)
    meet(counter, P)
    hists = tl.load(buf + parts[:, None] * BINS + bins[None, :])
    return pick_bin(hists, parts[:, None] < part, need)


@triton.jit
def last_taken(gather, share, need, first, PAIR_CAP: tl.constexpr):
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
def finish(
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
        bin = round_bins(x, pos, rnd, value_rounds, lo, scale)
        b, above, share, above_earlier, share_before = exchange(
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
        entry = share_before + before(live, WIDTH)
        _scatter(gather + entry, key.to(tl.int32, bitcast=True), live)
        _scatter(gather + PAIR_CAP + entry, pos, live)
        meet(counter, P)
        thr_key, thr_pos, chosen_before = last_taken(gather, share, need, first, PAIR_CAP)
        pick = (key > thr_key) | ((key == thr_key) & (pos <= thr_pos))
    else:  # the live keys are exactly those still needed
        chosen_before = share_before
        pick = live
    take = taken | (live & pick)
    slot = above_before + chosen_before + before(take, WIDTH)
    val = _transform(tl.where(take, pos, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
    _scatter(out_row + slot, val.to(tl.int32), take)

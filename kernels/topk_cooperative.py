"""Exact top-k in one launch: a row's programs narrow down its k-th key together, meeting at
barriers in global memory.

At small batch the three-launch top-k (kernels/topk.py) is latency-bound: three dependent launches
and a select that resolves ~3K candidates in one program per row. Here each row is split across P
programs (rows x P at most the SM count, launched cooperatively, so all of them are resident at
once and may wait for each other), each holding its slice of the row in registers, up to 8192 keys.
Once rows pass half the SMs a row is one program, which waits for no other: those launches are
plain and take any number of rows of up to 32K keys. A program whose span of the row is longer
than a slice (up to four slices; on 132 SMs, rows of 32K keys from 64 rows on, 32 of 128K) reads
it a slice at a time and holds only its list (step 2, _streamed). This module holds the kernel,
its streamed path and the launch; the steps the programs take together are in
kernels/topk_rounds.py (imported as `rounds`):

1. every program of the row reads the same strided sample of it and brackets the k-th key by
   value: the sample's keys ranked 3 binomial standard deviations either side of where the k-th
   key's rank falls in the sample, located to a 64th of the sample's span (rounds.bracket). The
   first round splits the bracket 62 ways, with one bin below it and one above: ~30 keys of a
   normal 32K row then share the k-th key's bin;
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
from . import topk_rounds as rounds
from .host_math import cdiv, next_power_of_2
from .topk import _ordered_key, _row, _scatter, _transform
from .topk_rounds import BINS
from .triton_dot import INTERPRET

PAIR_CAP = 64  # the most keys of the last bin ranked pairwise ([PAIR_CAP, PAIR_CAP] compares a program)
SAMPLE = 1024  # keys of the sample that places the first round's bins (rounds.bracket)
MIN_SLICE, MAX_SLICE = 512, 8192  # keys a program holds (device_parts)
MAX_SPAN = 4 * MAX_SLICE  # keys a program reads, a slice at a time (_streamed)
MAX_PARTS = 128  # a meeting adds 128 / P per program (rounds.meet)


@triton.jit
def _chunk(base, first, c, length, SLICE: tl.constexpr):
    """Slice c of a streamed program's span: its logits and positions."""
    pos = first + c * SLICE + tl.arange(0, SLICE)
    return rounds.load_slice(base, pos, length), pos


@triton.jit
def _decided(x, live, taken, lo, scale, b, nv, rnd: tl.constexpr):
    """Round rnd by value, if decided (nv rounds by value are): keys in bins above b are taken,
    those in b stay live."""
    bin = rounds.value_bins(x, lo, scale)
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
            hist += tl.histogram(rounds.round_bins(x, pos, rnd, value_rounds, lo, scale), BINS, mask=live)
        # exchange 0 was the list's: the rounds here take 1, 2, ...
        b, above, share, above_earlier, share_before = rounds.exchange(hist, exch, rnd + 1, counter, part, need, P)
        above_before += above_earlier
        need -= above
        if rnd < value_rounds:
            lo0, sc0, b0 = tl.where(rnd == 0, lo, lo0), tl.where(rnd == 0, scale, sc0), tl.where(rnd == 0, b, b0)
            lo1, sc1, b1 = tl.where(rnd == 1, lo, lo1), tl.where(rnd == 1, scale, sc1), tl.where(rnd == 1, b, b1)
            lo2, sc2, b2 = tl.where(rnd == 2, lo, lo2), tl.where(rnd == 2, scale, sc2), tl.where(rnd == 2, b, b2)
            nv += 1
            if rnd == 0:
                lo, scale = rounds.second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo,
                                                bracket_span)
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
    # the last key taken: as rounds.finish does, from the at most PAIR_CAP live keys gathered in position order
    thr_key = tl.zeros((), tl.uint32)
    thr_pos = tl.zeros((), tl.int32) + 0x7FFFFFFF
    chosen_before = share_before
    if share > need:
        listed = tl.zeros((), tl.int32)
        for c in range(CHUNKS):
            x, pos, live, taken = _chunk_state(base, first, c, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2,
                                               kmask, kpre, pmask, ppre, SLICE)
            entry = share_before + listed + rounds.before(live, SLICE)
            _scatter(gather + entry, _ordered_key(x).to(tl.int32, bitcast=True), live)
            _scatter(gather + PAIR_CAP + entry, pos, live)
            listed += tl.sum(live.to(tl.int32), axis=0)
        rounds.meet(counter, P)
        thr_key, thr_pos, chosen_before = rounds.last_taken(gather, share, need, first, PAIR_CAP)
    written = above_before + chosen_before
    for c in range(CHUNKS):
        x, pos, live, taken = _chunk_state(base, first, c, length, nv, lo0, sc0, b0, lo1, sc1, b1, lo2, sc2, b2, kmask,
                                           kpre, pmask, ppre, SLICE)
        key = _ordered_key(x)
        take = taken | (live & ((key > thr_key) | ((key == thr_key) & (pos <= thr_pos))))
        val = _transform(tl.where(take, pos, -1), row, bt_ptr, stride_bt, offs_ptr, NEXT_N, PAGE, TRANSFORM)
        _scatter(out_row + written + rounds.before(take, SLICE), val.to(tl.int32), take)
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
    value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo, scale = rounds.first_round(
        base, length, K, SAMPLE, 4.5)
    # two calls of _streamed_rounds: one after both branches makes a smaller kernel that spills (sm_90)
    if value_rounds > 0:  # the same in every program of the row, as b and the overflow below
        n_listed = tl.zeros((), tl.int32)
        for c in range(CHUNKS):
            x, pos = _chunk(base, first, c, length, SLICE)
            listed = (pos < length) & (rounds.value_bins(x, lo, scale) > 0)
            entry = n_listed + rounds.before(listed, SLICE)
            _scatter(lst + entry, pos, listed & (entry < SLICE))
            n_listed += tl.sum(listed.to(tl.int32), axis=0)
        tl.store(flags + part, (n_listed > SLICE).to(tl.int32))
        in_list, lpos, lx, lbin, hist = rounds.read_list(lst, base, n_listed, length, first, lo, scale,
                                                         SLICE * CHUNKS, SLICE)
        b, above, share, above_before, share_before = rounds.exchange(hist, exch, 0, counter, part, K, P)
        overflow = tl.max(tl.load(flags + tl.arange(0, P)), axis=0)  # ordered by the meeting, as the histograms
        if (b > 0) & (overflow == 0):
            lo2, scale2 = rounds.second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo,
                                              bracket_span)
            rounds.finish(lx, lpos, in_list & (lbin == b), in_list & (lbin > b), K - above, above_before, share_before,
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


@triton.jit(do_not_specialize=["stride_bt"])  # kernels/specialization.py
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
        x = rounds.load_slice(base, pos, length)
        value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span, lo, scale = rounds.first_round(
            base, length, K, SAMPLE, 3.0)
        exch = exch_ptr + row.to(tl.int64) * (2 * P * BINS)
        gather = gather_ptr + row.to(tl.int64) * (2 * PAIR_CAP)  # keys, then positions
        counter = counters + row
        bin = rounds.round_bins(x, pos, 0, value_rounds, lo, scale)
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
            _scatter(lst + rounds.before(listed, SLICE), pos, listed)
            in_list, lpos, lx, lbin, hist = rounds.read_list(lst, base, n_listed, length, first, lo, scale, SLICE, LIST)
        else:  # (the list's tensors go unused)
            in_list = at < 0
            lpos = at
            lx = at.to(tl.float32)
            lbin = at
            hist = tl.histogram(bin, BINS, mask=live)
        b, above, share, above_before, share_before = rounds.exchange(hist, exch, 0, counter, part, K, P)
        need = K - above
        lo, scale = rounds.second_round(b, lo, scale, value_rounds, sample_lo, sample_hi, bracket_lo, bracket_span)
        if on_list & (b > 0):  # the live and taken keys are all on the list
            rounds.finish(lx, lpos, in_list & (lbin == b), in_list & (lbin > b), need, above_before, share_before,
                          share, value_rounds, lo, scale, part, first, exch, counter, gather, row, out_row, bt_ptr,
                          stride_bt, offs_ptr, NEXT_N, LIST, P, PAIR_CAP, PAGE, TRANSFORM)
        else:
            rounds.finish(x, pos, live & (bin == b), live & (bin > b), need, above_before, share_before, share,
                          value_rounds, lo, scale, part, first, exch, counter, gather, row, out_row, bt_ptr, stride_bt,
                          offs_ptr, NEXT_N, SLICE, P, PAIR_CAP, PAGE, TRANSFORM)


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
    next_n: int, offsets, max_slice: int = MAX_SLICE, width: int | None = None,
) -> bool:
    """Arguments as kernels/topk.topk_transform, parts from parts_per_row; False (nothing written)
    when the driver refuses the grid as a cooperative launch, e.g. an MPS client given fewer SMs
    than the device has, or inside a capture with no barrier counters yet (grid_barrier.counters): the
    caller then takes the three launches. A program holds up to max_slice keys at once and streams
    a longer span (tests stream small rows with a small one). width: the widest range a row ranks
    (default: the logits' width)."""
    n, width = logits.shape[0], width or logits.shape[1]
    if parts > 1 and grid_barrier.refused(_KERNEL, logits.device, n * parts):
        return False
    # one-program rows meet no other
    counters = grid_barrier.counters(logits.device, n, _KERNEL, "the three launches") if parts > 1 else lengths
    if counters is None:
        return False
    slice_, chunks = slices(width, parts, max_slice)
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


def slices(width: int, parts: int, max_slice: int = MAX_SLICE) -> tuple[int, int]:
    """(keys a program holds at once, slices it streams): a part's span rounded up to a power of
    two, at least 256 keys."""
    span = max(next_power_of_2(cdiv(width, parts)), 256)
    slice_ = min(span, max_slice)
    return slice_, span // slice_


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


"""DeepGEMM's dense FP8 GEMM run on two row halves where its own launch for the whole is slow.

DeepGEMM picks its tiles from the shape. At some row counts it lays the whole product out as one
wave of large tiles, and then runs at a third to a half of its rate at the neighbouring counts:
on the H200, a [4096, 7168] weight (V3.2's shared expert, gate and up) takes 124-135 µs from 704
to 1024 rows against 53 µs at 1088, and each weight shape has its own such counts
(docs/PERFORMANCE.md, "DeepGEMM's one-wave row counts"). Two calls on the row halves take other
tiles, and give the same bits: a row's outputs do not depend on how the rows are tiled.

Which counts lose depends on the weight's shape, the GPU and DeepGEMM's version, so they are
measured, not predicted: `calibrate` times one weight both ways at the top of each bucket of
BUCKET rows (within one, DeepGEMM's choice stays the same: its row tiles are 64, 128 or 256), and
`gemm` splits the buckets where the halves won by SPLIT_GAIN. The engine calibrates every FP8
weight shape at its warm-up (dsa_backend/warmup.py), which also compiles DeepGEMM's kernel for
each bucket before serving.
"""

from __future__ import annotations

import statistics

import torch

BUCKET = 64
SPLIT_GAIN = 0.9    # halves at most this fraction of the whole's time: timing noise never splits
_TIMED_CALLS, _ROUNDS = 4, 3
_split: dict[tuple[int, int], frozenset[int]] = {}  # (N, K) of a weight -> buckets run as halves


def bucket(rows: int) -> int:
    return -(-rows // BUCKET)


def _halves(rows: int) -> int:
    """Rows of the first half: half the buckets, rounded up."""
    return -(-bucket(rows) // 2) * BUCKET


def _call(library, a, a_scale, w, w_scale, out, halves: bool) -> None:
    if not halves:
        library.fp8_gemm_nt((a, a_scale), (w, w_scale), out)
        return
    h = _halves(a.shape[0])
    library.fp8_gemm_nt((a[:h], a_scale[:h]), (w, w_scale), out[:h])
    library.fp8_gemm_nt((a[h:], a_scale[h:]), (w, w_scale), out[h:])


def gemm(library, a, a_scale, w, w_scale) -> torch.Tensor:
    """a [M, K] e4m3 (a_scale [M, K/128]) times w [N, K] e4m3 (block scales) transposed -> [M, N]
    bf16 through DeepGEMM's fp8_gemm_nt, on row halves where `calibrate` found them faster."""
    out = torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16, device=a.device)
    _call(library, a, a_scale, w, w_scale, out, bucket(a.shape[0]) in split_buckets(w))
    return out


def split_buckets(w: torch.Tensor) -> frozenset[int]:
    return _split.get(tuple(w.shape), frozenset())


def row_ranges(buckets) -> str:
    """Buckets as the row ranges they hold, for logs: "641-768, 897-1024"."""
    ranges, first = [], None
    for b in sorted(buckets):
        first = b if first is None else first
        if b + 1 not in buckets:
            ranges.append(f"{(first - 1) * BUCKET + 1}-{b * BUCKET}")
            first = None
    return ", ".join(ranges)


def _hold_gpu() -> None:
    """Keep the GPU busy (~0.5 ms) while the host queues the timed calls, so that host time does not
    show in them. torch's _sleep is private: without it host time may show, which can only favour
    the one call (one launch against two) and split less."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(1_000_000)


def calibrate(library, w, w_scale, max_rows: int, first_rows: int) -> frozenset[int]:
    """Time the GEMM on w whole and on halves at each bucket's top from first_rows up to max_rows
    rows (random activations), alternating, the median of _ROUNDS; keep the buckets the halves won
    by SPLIT_GAIN. Compiles DeepGEMM's kernel for every bucket on the way. Call on an idle GPU."""
    tops = [min(b * BUCKET, max_rows) for b in range(max(2, bucket(first_rows)), bucket(max_rows) + 1)]
    if not tops:  # one bucket: no halves
        return split_buckets(w)
    from .fp8_gemm import quantize_act

    a, a_scale = quantize_act(torch.randn(max_rows, w.shape[1], device=w.device, dtype=torch.bfloat16))
    out = torch.empty(max_rows, w.shape[0], dtype=torch.bfloat16, device=w.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time_of(rows: int, halves: bool) -> float:
        args = (library, a[:rows], a_scale[:rows], w, w_scale, out[:rows], halves)
        _call(*args)  # warm; the bucket's first call compiles
        _hold_gpu()
        start.record()
        for _ in range(_TIMED_CALLS):
            _call(*args)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    split = set()
    for rows in tops:
        whole, halves = [], []
        for _ in range(_ROUNDS):
            whole.append(time_of(rows, False))
            halves.append(time_of(rows, True))
        if statistics.median(halves) <= SPLIT_GAIN * statistics.median(whole):
            split.add(bucket(rows))
    _split[tuple(w.shape)] = frozenset(split)
    return _split[tuple(w.shape)]

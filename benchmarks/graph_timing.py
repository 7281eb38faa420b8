"""CUDA-graph timing for the benchmark scripts: the call is warmed up on the stream that captures
it, as an engine's warm-up runs, so that state a kernel makes lazily per stream exists before the
capture (the top-k's barrier counters: a capture that finds none takes the three launches,
kernels/topk_cooperative.py). triton.testing.do_bench_cudagraph warms up on another stream."""

from __future__ import annotations

import statistics

import torch


def capture(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A graph of `calls` calls of fn, after one eager call on the capture stream."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    return graph


def graph_ms(fn, rep_ms: float = 30.0, replays: int = 10) -> float:
    """Median milliseconds a call, over `replays` replays of a graph of as many calls as take about
    rep_ms (do_bench_cudagraph's method, with the warm-up on the capture stream)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    calls = max(1, min(10000, int(rep_ms / max(start.elapsed_time(end) / 5, 1e-4))))
    graph = capture(fn, calls)
    per_call = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) / calls)
    return statistics.median(per_call)


def alternating_us(fns: dict, rounds: int = 3, **graph) -> dict:
    """Each call's graph_ms (with `graph`'s rep_ms, replays) in microseconds, `rounds` times, in the
    dict's order and then backwards by turns, so that no call always runs first (a board's clock
    drifts between them)."""
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[name].append(round(graph_ms(fns[name], **graph) * 1e3, 2))
    return times

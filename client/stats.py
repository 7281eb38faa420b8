"""Latency and throughput summaries of one load level (pure functions of the completions)."""

from __future__ import annotations

import numpy as np

from dsa_client.grpc_stream import Completion

PERCENTILES = (50, 90, 99)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    array = np.asarray(values, dtype=np.float64)
    return {f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES} | {"mean": float(array.mean())}


def inter_token_latencies(c: Completion) -> list[float]:
    """Seconds per token between responses that carried text, after the first."""
    times = [t for d, t in zip(c.deltas, c.times) if d]
    return [b - a for a, b in zip(times, times[1:])]


def summarize(completions: list[Completion], wall_s: float) -> dict:
    """TTFT, ITL and end-to-end latency percentiles (seconds), token and request throughput."""
    ok = [c for c in completions if not c.error]
    output_tokens = sum(c.num_output_tokens for c in ok)
    input_tokens, cached_tokens = sum(c.num_input_tokens for c in ok), sum(c.num_cached_tokens for c in ok)
    drafted, accepted = sum(c.draft_tokens for c in ok), sum(c.accepted_draft_tokens for c in ok)
    return {
        "requests": len(completions),
        "errors": len(completions) - len(ok),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else None,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        # prompt tokens the server's prefix cache served instead of computing them
        "cached_input_tokens": cached_tokens,
        "prefix_cache_hit_rate": cached_tokens / input_tokens if input_tokens else None,
        "ttft_s": percentiles([c.ttft_s for c in ok if c.ttft_s is not None]),
        "itl_s": percentiles([x for c in ok for x in inter_token_latencies(c)]),
        "e2e_s": percentiles([c.e2e_s for c in ok if c.e2e_s is not None]),
        # speculative decoding: accepted / drafted over all requests (None when nothing was drafted)
        "draft_tokens": drafted,
        "accepted_draft_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
    }

"""Prefix caching: time to first token and whole-batch time for requests that share a long prefix
(a system prompt, an earlier turn), with the prefix cache on against off, on one Engine.

    python3 benchmarks/bench_prefix_cache.py --model /tmp/v32 [--prefix-len 8192] [--suffix-len 64]
        [--batch 16] [--max-tokens 16] [--rounds 3]

Each round runs every mode, alternating in this one process: "off" turns the engine's prefix
cache off for its requests (nothing is matched or cached), "on" serves them with the prefix
already cached by an untimed warm-up of every mode (which also compiles what each runs). "cold"
serves them with a prefix nobody has computed yet, arriving together: the scheduler has the
first compute it and the others wait for its pages (scheduler.py); "cold-no-wait" is the same
with that wait switched off (Scheduler._computed_by_others replaced by False, as the scheduler
was before it): every request admitted in the first step computes the prefix. Each mode times one
request alone (arrival to its first token: the prefill of what is not cached) and then a batch
of requests arriving together (arrival to every request's last token). Every request's suffix is
new, so only the shared prefix can be found; --suffix-len 0 makes the batch n samples of one
prompt (SamplingParams.n). Prints one JSON line; --json writes it to a file too.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import statistics
import time

import torch

import dsa_kernels
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams
from report import emit

_IDS = itertools.count()


def _sync(engine: Engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def serve(engine: Engine, prompts: list[list[int]], max_tokens: int) -> dict:
    """Arrival of every prompt at once to each one's first and last token, in seconds."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ids = [f"r{next(_IDS)}" for _ in prompts]
    _sync(engine)
    t0 = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    first, last = {}, {}
    while len(last) < len(ids):
        for out in engine.step():
            now = time.perf_counter() - t0
            first.setdefault(out.request_id, now)
            if out.finished:
                last[out.request_id] = now
    return dict(ttft_s=[first[r] for r in ids], done_s=max(last.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefix-len", type=int, default=8192)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-cache-dtype", default="fp8")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--json")
    a = ap.parse_args()
    per_request = -(-(a.prefix_len + a.suffix_len + a.max_tokens) // 64)
    engine = Engine(EngineArgs(model=a.model, device=a.device, kv_cache_dtype=a.kv_cache_dtype,
                               num_kv_pages=(a.batch + 2) * per_request, max_running_requests=a.batch,
                               max_num_batched_tokens=a.max_num_batched_tokens))
    gen = torch.Generator().manual_seed(0)

    def prompts(n: int, prefix: list[int]) -> list[list[int]]:
        # a fresh suffix each; the prompt's last token is always computed, so a suffix of 0 repeats it
        return [prefix + torch.randint(2, 128000, (a.suffix_len,), generator=gen).tolist() for _ in range(n)]

    def new_prefix() -> list[int]:
        return torch.randint(2, 128000, (a.prefix_len,), generator=gen).tolist()

    warm = new_prefix()
    cache, scheduler = engine.scheduler.pages, engine.scheduler
    modes = ("off", "cold-no-wait", "cold", "on")

    def run(mode: str, n: int) -> dict:
        cache.enabled = mode != "off"
        if mode == "cold-no-wait":
            scheduler._computed_by_others = lambda seq: False
        else:
            scheduler.__dict__.pop("_computed_by_others", None)
        return serve(engine, prompts(n, warm if mode in ("on", "off") else new_prefix()), a.max_tokens)

    for mode in modes:  # untimed: compiles what each mode runs, and leaves the warm prefix cached
        run(mode, a.batch + 1)
    runs = []
    for r in range(a.rounds):
        for mode in modes:
            hits = engine.scheduler.num_cached_tokens
            alone = run(mode, 1)
            batch = run(mode, a.batch)
            runs.append(dict(round=r, mode=mode, ttft_alone_ms=round(1000 * alone["ttft_s"][0], 2),
                             batch_ttft_median_ms=round(1000 * statistics.median(batch["ttft_s"]), 2),
                             batch_done_ms=round(1000 * batch["done_s"], 2),
                             cached_tokens=engine.scheduler.num_cached_tokens - hits))
            print(runs[-1], flush=True)
    cache.enabled = True
    scheduler.__dict__.pop("_computed_by_others", None)
    medians = {mode: {key: statistics.median(run[key] for run in runs if run["mode"] == mode)
                      for key in ("ttft_alone_ms", "batch_ttft_median_ms", "batch_done_ms")}
               for mode in modes}
    result = dict(date=datetime.date.today().isoformat(),
                  gpu=torch.cuda.get_device_name() if a.device == "cuda" else a.device,
                  libraries=dsa_kernels.available_backends(a.device), model=a.model, prefix_len=a.prefix_len,
                  suffix_len=a.suffix_len, batch=a.batch, max_tokens=a.max_tokens,
                  kv_cache_dtype=a.kv_cache_dtype, runs=runs, median_over_rounds=medians,
                  max_num_batched_tokens=a.max_num_batched_tokens,
                  on_over_off={key: round(medians["off"][key] / medians["on"][key], 2) for key in medians["on"]},
                  cold_over_cold_no_wait={key: round(medians["cold-no-wait"][key] / medians["cold"][key], 2)
                                          for key in medians["on"]})
    emit(result, a.json)


if __name__ == "__main__":
    main()

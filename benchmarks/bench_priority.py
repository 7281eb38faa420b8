"""Priorities: an urgent request's time to first token and to its end while the running batch is
full and more requests wait, sent at priority 0 (first come, first served) against -1, on one Engine.

    python3 benchmarks/bench_priority.py --model /tmp/v32 [--batch 32] [--prompt-len 1024]
        [--background-tokens 256] [--urgent-tokens 32] [--rounds 3]

Each round fills the engine with 2 x batch background requests (max_running_requests = batch, so
half of them wait), runs 16 decode steps, then adds the urgent request and steps until it ends;
then it aborts the background. The modes alternate in this one process, after an untimed round
of each. Reported: the urgent request's first token and end (ms from its arrival), and the
background tokens made meanwhile a second (what the retraction costs the others). Prints one
JSON line; --json writes it to a file too.
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


def one_round(engine: Engine, prompts: list[list[int]], urgent_prompt: list[int], a, priority: int) -> dict:
    background = SamplingParams(max_tokens=a.background_tokens, temperature=0, ignore_eos=True)
    ids = [f"bg{next(_IDS)}" for _ in prompts]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, background, priority=0)
    for _ in range(16):
        engine.step()
    retractions = engine.scheduler.num_retractions
    urgent = f"urgent{next(_IDS)}"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.add_request(urgent, urgent_prompt, SamplingParams(max_tokens=a.urgent_tokens, temperature=0, ignore_eos=True),
                       priority=priority)
    first = end = None
    background_tokens = 0
    while end is None:
        for out in engine.step():
            now = time.perf_counter() - t0
            if out.request_id == urgent:
                first = first if first is not None else now
                end = now if out.finished else None
            else:
                background_tokens += len(out.new_token_ids)
    for rid in ids:
        engine.abort(rid)
    while engine.has_work():
        engine.step()
    return dict(ttft_ms=round(1000 * first, 2), end_ms=round(1000 * end, 2),
                background_tokens_per_s=round(background_tokens / end),
                retractions=engine.scheduler.num_retractions - retractions)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--background-tokens", type=int, default=256)
    ap.add_argument("--urgent-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    per_request = -(-(a.prompt_len + max(a.background_tokens, a.urgent_tokens)) // 64)
    engine = Engine(EngineArgs(model=a.model, device="cuda", kv_cache_dtype="fp8",
                               num_kv_pages=(2 * a.batch + 2) * per_request, max_running_requests=a.batch,
                               max_num_batched_tokens=8192, enable_prefix_caching=False))
    gen = torch.Generator().manual_seed(0)

    def prompt() -> list[int]:
        return torch.randint(2, 128000, (a.prompt_len,), generator=gen).tolist()

    modes = {"first-come": 0, "priority": -1}
    runs = []
    for r in range(a.rounds + 1):       # round 0 untimed: compiles what each mode runs
        for mode, priority in modes.items():
            result = one_round(engine, [prompt() for _ in range(2 * a.batch)], prompt(), a, priority)
            if r:
                runs.append(dict(round=r, mode=mode, **result))
                print(runs[-1], flush=True)
    medians = {mode: {key: statistics.median(run[key] for run in runs if run["mode"] == mode)
                      for key in ("ttft_ms", "end_ms", "background_tokens_per_s")} for mode in modes}
    emit(dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
              libraries=dsa_kernels.available_backends("cuda"), model=a.model, batch=a.batch,
              prompt_len=a.prompt_len, background_tokens=a.background_tokens, urgent_tokens=a.urgent_tokens,
              runs=runs, medians=medians,
              first_come_over_priority={key: round(medians["first-come"][key] / medians["priority"][key], 2)
                                        for key in ("ttft_ms", "end_ms")}), a.json)


if __name__ == "__main__":
    main()

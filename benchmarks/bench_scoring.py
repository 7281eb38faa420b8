"""Scoring prompts: what SamplingParams.prompt_logprobs costs over the plain prefill of the same
prompts, on one Engine.

    python3 benchmarks/bench_scoring.py --model /tmp/v32 [--batch 16] [--prompt-len 2048] [--rounds 3]

Each round serves a batch of new random prompts (nothing in the prefix cache) arriving together,
max_tokens 1, once plain and once asking for every prompt token's log prob, alternating; an
untimed round of both first compiles what each runs. The time is arrival to the last request's
end. The reference measured in the same run is the LM head's GEMM alone over every prompt
position (what scoring cannot do without). Prints one JSON line with the medians, scored / plain
and the extra time over that GEMM's; --json writes it to a file too.
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


def serve(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> float:
    """Seconds from the prompts' arrival to the last one's end; checks every scored output."""
    ids = [f"r{next(_IDS)}" for _ in prompts]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    done = 0
    while done < len(ids):
        for out in engine.step():
            if out.prompt_logprobs is not None:
                assert len(out.prompt_logprobs) == len(prompts[0])
            done += out.finished
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(EngineArgs(model=a.model, device="cuda", kv_cache_dtype="fp8",
                               num_kv_pages=(a.batch + 2) * (-(-(a.prompt_len + 1) // 64)),
                               max_running_requests=a.batch, max_num_batched_tokens=a.max_num_batched_tokens))
    gen = torch.Generator().manual_seed(0)
    modes = {"plain": SamplingParams(max_tokens=1, temperature=0),
             "scored": SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=True)}

    def run(mode: str) -> float:
        prompts = [torch.randint(2, 128000, (a.prompt_len,), generator=gen).tolist() for _ in range(a.batch)]
        return serve(engine, prompts, modes[mode])

    for mode in modes:      # untimed: compiles what each mode runs
        run(mode)
    runs = []
    for r in range(a.rounds):
        for mode in modes:
            runs.append(dict(round=r, mode=mode, batch_ms=round(1000 * run(mode), 2)))
            print(runs[-1], flush=True)
    medians = {mode: statistics.median(run["batch_ms"] for run in runs if run["mode"] == mode) for mode in modes}
    tokens = a.batch * a.prompt_len
    head_ms = lm_head_gemm_ms(engine, tokens)
    emit(dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
              libraries=dsa_kernels.available_backends("cuda"), model=a.model, batch=a.batch,
              prompt_len=a.prompt_len, max_num_batched_tokens=a.max_num_batched_tokens, runs=runs,
              median_batch_ms=medians, prompt_tokens_per_s={m: round(tokens / medians[m] * 1000) for m in modes},
              scored_over_plain=round(medians["scored"] / medians["plain"], 3), lm_head_gemm_ms=round(head_ms, 2),
              extra_over_lm_head_gemm=round((medians["scored"] - medians["plain"]) / head_ms, 3)), a.json)


def lm_head_gemm_ms(engine: Engine, rows: int, rows_a_piece: int = 256) -> float:
    """The floor of what scoring adds: the LM head's GEMM alone over every prompt position, in
    the pieces the engine takes, best of three (CUDA events)."""
    model = engine.model
    weight = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    hidden = torch.randn(rows_a_piece, weight.shape[1], device=weight.device, dtype=weight.dtype)
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(-(-rows // rows_a_piece)):
            torch.nn.functional.linear(hidden, weight)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return min(times)


if __name__ == "__main__":
    main()

"""Engine prefill throughput: a batch of new prompts arriving together, to every first token.

    python3 benchmarks/bench_prefill.py --model /tmp/v32 [--prompt-len 8192] [--batch 4] [--rounds 3]
        [--max-num-batched-tokens 8192] [--fp8-warmup]

Every prompt is new random tokens (nothing for the prefix cache to find) and asks for one token,
so a round is the prefill chunks of batch x prompt-len tokens, max_num_batched_tokens a step, and
one sampling. An untimed first round compiles what the rounds run; --fp8-warmup first runs the
warm-up's FP8 GEMM part (warm_up_fp8_gemms, which also calibrates DeepGEMM's row halves). Reports
each round's seconds and the median round's prompt tokens a second. Prints one JSON line; --json
writes it to a file too.
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
from dsa_backend.warmup import warm_up_fp8_gemms
from report import emit

_IDS = itertools.count()


def prefill_s(engine: Engine, prompts: list[list[int]]) -> float:
    """Seconds from every prompt's arrival to the last first token."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    ids = {f"r{next(_IDS)}" for _ in prompts}
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for rid, prompt in zip(sorted(ids), prompts):
        engine.add_request(rid, prompt, params)
    while ids:
        for out in engine.step():
            ids.discard(out.request_id)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-cache-dtype", default="fp8")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--fp8-warmup", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(EngineArgs(model=a.model, device=a.device, kv_cache_dtype=a.kv_cache_dtype,
                               num_kv_pages=a.batch * (-(-(a.prompt_len + 1) // 64) + 1),
                               max_running_requests=a.batch, max_num_batched_tokens=a.max_num_batched_tokens))
    if a.fp8_warmup:
        warm_up_fp8_gemms(engine.model, a.max_num_batched_tokens, engine.config.num_experts_per_tok)
    gen = torch.Generator().manual_seed(0)

    def prompts() -> list[list[int]]:
        return [torch.randint(2, 128000, (a.prompt_len,), generator=gen).tolist() for _ in range(a.batch)]

    prefill_s(engine, prompts())  # compiles
    rounds = [round(prefill_s(engine, prompts()), 4) for _ in range(a.rounds)]
    median = statistics.median(rounds)
    emit(dict(date=datetime.date.today().isoformat(), device=str(engine.device), model=a.model,
              gpu=torch.cuda.get_device_name() if engine.device.type == "cuda" else None,
              libraries=dsa_kernels.available_backends(engine.device), prompt_len=a.prompt_len, batch=a.batch,
              max_num_batched_tokens=a.max_num_batched_tokens, fp8_warmup=a.fp8_warmup, rounds_s=rounds,
              median_s=median,
              prompt_tokens_per_s=round(a.batch * a.prompt_len / median)), a.json)


if __name__ == "__main__":
    main()

"""A sampling step with a repetition penalty on every row: the host's time to build the batch and
the GPU's time to sample, as decode steps see them (each row's output grows by its sampled token).

    python3 benchmarks/bench_penalties.py [--batch 32] [--prompt-len 2112] [--vocab 129280]

The counts are kept across steps (dsa_backend.token_counts) as the engine keeps them. Each step
synchronizes, so the two times are apart; prints one JSON line (medians over --steps).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dsa_backend.sampling import SamplingBatch, SamplingRow, sample
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.token_counts import TokenCounts
from report import emit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=2112)
    ap.add_argument("--output-len", type=int, default=64, help="output tokens before the first step")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, a.vocab, (a.prompt_len,), generator=gen).tolist() for _ in range(a.batch)]
    outputs = [torch.randint(0, a.vocab, (a.output_len,), generator=gen).tolist() for _ in range(a.batch)]
    params = SamplingParams(max_tokens=4096, repetition_penalty=1.1, temperature=0.0)
    counts = TokenCounts(a.batch, a.vocab, device)
    logits = torch.randn(a.batch, a.vocab, device=device)
    host_ms, gpu_ms = [], []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        rows = [SamplingRow(params, p, o, key=i) for i, (p, o) in enumerate(zip(prompts, outputs))]
        batch = SamplingBatch.build(rows, a.vocab, [1], device, counts=counts)
        t1 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        tokens = sample(logits, batch).token_ids
        end.record()
        torch.cuda.synchronize()
        for output, token in zip(outputs, tokens.tolist()):
            output.append(token)
        if step >= a.warmup:
            host_ms.append((t1 - t0) * 1e3)
            gpu_ms.append(start.elapsed_time(end))
    emit(dict(batch=a.batch, prompt_len=a.prompt_len, vocab=a.vocab, host_build_ms=round(statistics.median(host_ms), 4),
              gpu_sample_ms=round(statistics.median(gpu_ms), 4), gpu=torch.cuda.get_device_name()), a.json)


if __name__ == "__main__":
    main()

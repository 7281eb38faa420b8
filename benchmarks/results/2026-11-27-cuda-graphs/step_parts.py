"""Where a decode step's time goes with CUDA graphs: the batch's build on the host, the forward
(graph replay against the eager forward, wall and GPU time), and sampling with its read back.

    python3 step_parts.py --model /tmp/v32 [--batch 32] [--prompt-len 2100] [--reps 20] [--json F]

The forwards run on one decode batch of the engine's requests, rebuilt each rep (each writes the
same KV slot again). Medians of --reps, ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling import SamplingBatch, SamplingRow, sample
from dsa_backend.sampling_params import SamplingParams


def timed(fn, reps: int) -> tuple[float, float]:
    """(median wall ms with a sync after each, median GPU ms between events around it)."""
    wall, gpu = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        wall.append(1000 * (time.perf_counter() - t))
        gpu.append(start.elapsed_time(end))
    return round(statistics.median(wall), 3), round(statistics.median(gpu), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=2100)  # no request crosses a page while the others prefill
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=a.batch * (a.prompt_len // 64 + 4),
                               max_running_requests=a.batch, max_num_batched_tokens=8192))
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    for i in range(a.batch):
        engine.add_request(f"r{i}", torch.randint(2, 128000, (a.prompt_len,), generator=gen).tolist(), params)
    seqs = list(engine.sequences.values())
    with torch.inference_mode():
        while any(not s.output_ids for s in seqs):
            engine.step()

        def build():
            return ForwardBatch.build(ForwardMode.DECODE, [[s.output_ids[-1]] for s in seqs],
                                      [s.num_computed for s in seqs], [s.pages for s in seqs], 64, engine.device)

        batch = build()
        rows = [SamplingRow(s.params, s.prompt_ids, s.output_ids, s.generator) for s in seqs]
        logits = engine.graphs.forward(batch).logits.clone()

        def sampled():
            sampling = SamplingBatch.build(rows, engine.config.vocab_size, engine.config.eos_token_ids, engine.device)
            return sample(logits, sampling, engine.generator).token_ids.tolist()

        parts = {"build": timed(build, a.reps), "replay": timed(lambda: engine.graphs.forward(batch), a.reps),
                 "eager_forward": timed(lambda: engine.model(batch, engine.cache), a.reps),
                 "sample": timed(sampled, a.reps)}
        graph = engine.graphs.graphs[max(engine.graphs.graphs)]
        parts["graph_replay_only"] = timed(graph.replay, a.reps)
    result = dict(gpu=torch.cuda.get_device_name(), model=a.model, batch=a.batch, prompt_len=a.prompt_len,
                  reps=a.reps, wall_and_gpu_ms=parts)
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""What a context bucket wider than the batch's longest context costs a decode replay: one batch
(contexts ~2100) replayed in graphs captured for contexts 2112 (exact), 4096 (its bucket), 8192,
16384 and 32768, GPU time by events, medians of --reps.

    python3 bucket_cost.py --model /tmp/v32 [--batch 32] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams


def gpu_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=a.batch * 40,
                               max_running_requests=a.batch, max_num_batched_tokens=8192))
    gen = torch.Generator().manual_seed(0)
    for i in range(a.batch):
        engine.add_request(f"r{i}", torch.randint(2, 128000, (2100,), generator=gen).tolist(),
                           SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    seqs = list(engine.sequences.values())
    graphs, result = engine.graphs, {}
    with torch.inference_mode():
        while any(not s.output_ids for s in seqs):
            engine.step()
        batch = ForwardBatch.build(ForwardMode.DECODE, [[s.output_ids[-1]] for s in seqs],
                                   [s.num_computed for s in seqs], [s.pages for s in seqs], 64, engine.device)
        graphs._fill(batch, a.batch)
        for context in (2112, 4096, 8192, 16384, 32768):
            graph = graphs._capture(a.batch, context)
            result[context] = gpu_ms(graph.replay, a.reps)
            del graph
    out = dict(gpu=torch.cuda.get_device_name(), model=a.model, batch=a.batch, longest_context=batch.max_seq_len,
               replay_gpu_ms_by_context_bucket=result)
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

"""Where a speculative (MTP chain) engine step's time goes with the verify graphs: each part timed
with a sync on both sides, summed over the timed steps, ms a step.

    python3 spec_parts.py --model /tmp/v32 [--batch 32] [--prompt-len 2112] [--num-steps 2] [--steps 16]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from dsa_backend import engine as engine_module
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

TOTALS: dict[str, float] = defaultdict(float)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        TOTALS[name] += time.perf_counter() - t
        return out
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=2112)
    ap.add_argument("--num-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=a.batch * (a.prompt_len // 64 + 8),
                               max_running_requests=a.batch, max_num_batched_tokens=8192,
                               speculative_algorithm="mtp", speculative_num_steps=a.num_steps))
    gen = torch.Generator().manual_seed(0)
    for i in range(a.batch):
        engine.add_request(f"r{i}", torch.randint(2, 128000, (a.prompt_len,), generator=gen).tolist(),
                           SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True))
    seqs = list(engine.sequences.values())
    while any(len(s.output_ids) < 3 for s in seqs):  # prefill, captures, warm-up
        engine.step()
    engine.graphs.forward = timed("verify forward (graph)", engine.graphs.forward)
    engine._forward_batch = timed("ForwardBatch.build", engine._forward_batch)
    engine.drafter.draft = timed("drafter.draft (MTP, eager)", engine.drafter.draft)
    engine_module.compact_accepted_path = timed("compact_accepted_path", engine_module.compact_accepted_path)
    engine.scheduler.schedule = timed("scheduler.schedule", engine.scheduler.schedule)
    step = timed("whole step", engine.step)
    for _ in range(a.steps):
        step()
    parts = {name: round(1000 * total / a.steps, 3) for name, total in TOTALS.items()}
    result = dict(gpu=torch.cuda.get_device_name(), model=a.model, batch=a.batch, num_steps=a.num_steps,
                  ms_a_step=parts)
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

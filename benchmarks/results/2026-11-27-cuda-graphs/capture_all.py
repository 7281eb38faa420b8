"""Start-up cost of capturing every decode bucket (DecodeGraphs.capture_all) and the memory it holds.

    python3 capture_all.py --model /tmp/v32 [--max-running 32] [--max-model-len 163840] [--json F]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dsa_backend.engine import Engine, EngineArgs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-running", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=163840)
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=4096,
                               max_running_requests=a.max_running, max_model_len=a.max_model_len))
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    t = time.perf_counter()
    engine.graphs.capture_all()
    torch.cuda.synchronize()
    result = dict(gpu=torch.cuda.get_device_name(), model=a.model, graphs=len(engine.graphs.graphs),
                  batch_buckets=engine.graphs.batch_buckets, context_buckets=engine.graphs.context_buckets,
                  seconds=round(time.perf_counter() - t, 1),
                  reserved_gib_added=round((torch.cuda.memory_reserved() - before) / 2**30, 3))
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""Session 58: where an engine prefill step's GPU time goes (v32 slice), by kernel."""
import json
import logging
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from bench_prefill import prefill_s  # noqa: E402
from dsa_backend.engine import Engine, EngineArgs  # noqa: E402
from dsa_backend.warmup import warm_up_fp8_gemms  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
model, out = sys.argv[1], sys.argv[2]
result = {}
for batch, plen, chunk, fp8_warm in ((1, 1024, 2048, True), (2, 8192, 8192, False)):
    engine = Engine(EngineArgs(model=model, device="cuda", kv_cache_dtype="fp8", num_kv_pages=batch * (plen // 64 + 2),
                               max_running_requests=batch, max_num_batched_tokens=chunk))
    t0 = time.time()
    if fp8_warm:
        warm_up_fp8_gemms(engine.model, chunk, engine.config.num_experts_per_tok)
    warm = round(time.time() - t0, 1)
    gen = torch.Generator().manual_seed(0)
    prompts = lambda: [torch.randint(2, 128000, (plen,), generator=gen).tolist() for _ in range(batch)]  # noqa: E731
    prefill_s(engine, prompts())
    rounds = [round(prefill_s(engine, prompts()), 4) for _ in range(3)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        prefill_s(engine, prompts())
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows.append((round(e.device_time_total / 1e3, 3), e.count, e.key[:110]))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    key = f"b{batch}_p{plen}"
    result[key] = dict(fp8_warmup_s=warm, rounds_s=rounds, kernel_ms_total=round(total, 2), top=rows[:40])
    print(key, warm, rounds, round(total, 2), flush=True)
    for r in rows[:25]:
        print(f"  {r[0]:9.3f} ms {r[1]:5d}  {r[2]}", flush=True)
    del engine
    torch.cuda.empty_cache()
json.dump(result, open(out, "w"), indent=1)

"""Why bench_engine's first kernel round decodes slower than a second (30-40 vs 20 ms a step at
batch 32): every engine step timed, with the Python GC's time inside it, the CUDA allocator's
reserved bytes and segment count after it, and the distinct experts its MoE layers ran."""
import gc
import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import bench_engine  # noqa: E402
from dsa_backend.attention import KernelDsaBackend  # noqa: E402
from dsa_backend.engine import Engine, EngineArgs  # noqa: E402
from dsa_backend.models import moe  # noqa: E402

gc_ms = [0.0]
_gc_t = [0.0]


def on_gc(phase, info):
    if phase == "start":
        _gc_t[0] = time.perf_counter()
    else:
        gc_ms[0] += 1e3 * (time.perf_counter() - _gc_t[0])


gc.callbacks.append(on_gc)
experts = [0]
_forward = moe.Experts.forward


def counted(self, x, ids, weights):
    experts[0] += int(ids.unique().numel())
    return _forward(self, x, ids, weights)


moe.Experts.forward = counted

model, batch, prompt_len = sys.argv[1], 32, 2112
pages = batch * (-(-(prompt_len + bench_engine._MAX_TOKENS) // 64)) + 8
engine = Engine(EngineArgs(model=model, device="cuda", kv_cache_dtype="fp8", num_kv_pages=pages,
                           max_running_requests=batch, max_num_batched_tokens=8192))
step = engine.step
rows = []


def timed_step():
    torch.cuda.synchronize()
    gc_ms[0], experts[0] = 0.0, 0
    t = time.perf_counter()
    out = step()
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t)
    s = torch.cuda.memory_stats()
    rows.append(dict(t=round(time.time(), 3), ms=round(ms, 1), outputs=len(out), gc_ms=round(gc_ms[0], 1),
                     experts=experts[0], reserved_mb=s["reserved_bytes.all.current"] >> 20,
                     segments=s["segment.all.current"], cuda_mallocs=s["segment.all.allocated"]))
    print(json.dumps(rows[-1]), flush=True)
    return out


engine.step = timed_step
for rnd in range(int(sys.argv[2])):
    print(f"=== round {rnd}", flush=True)
    print(bench_engine.decode_throughput(engine, KernelDsaBackend(), batch, prompt_len, 16, 2, f"k{rnd}"), flush=True)

"""Where an engine decode step's time goes on the GPU: wall time a step against the GPU's busy
time, and the kernels that fill it (torch.profiler), kernel backend, batch 32 past prefill."""
import json
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from bench_engine import _MAX_TOKENS  # noqa: E402
from dsa_backend.attention import KernelDsaBackend  # noqa: E402
from dsa_backend.engine import Engine, EngineArgs  # noqa: E402
from dsa_backend.sampling_params import SamplingParams  # noqa: E402

model, batch, prompt_len, steps = sys.argv[1], 32, 2112, 8
import os
device = os.environ.get("DEVICE", "cuda")
if device == "cpu":  # a smoke run of this script
    batch, prompt_len, steps = 2, 80, 2
pages = batch * (-(-(prompt_len + _MAX_TOKENS) // 64)) + 8
engine = Engine(EngineArgs(model=model, device=device, kv_cache_dtype="fp8", num_kv_pages=pages,
                           max_running_requests=batch, max_num_batched_tokens=8192))
engine.model.backend = KernelDsaBackend()
gen = torch.Generator().manual_seed(0)
params = SamplingParams(max_tokens=_MAX_TOKENS, temperature=0, ignore_eos=True)
for i in range(batch):
    engine.add_request(f"r{i}", torch.randint(2, 128000, (prompt_len,), generator=gen).tolist(), params)
produced = {f"r{i}": 0 for i in range(batch)}
while min(produced.values()) < 4:
    for out in engine.step():
        produced[out.request_id] += len(out.new_token_ids)
device == "cuda" and torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    device == "cuda" and torch.cuda.synchronize()
    wall = time.perf_counter() - t0
events = prof.key_averages()
gpu_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
launches = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
top = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
             key=lambda e: -e.self_device_time_total)[:25]
cpu_top = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                 key=lambda e: -e.self_cpu_time_total)[:15]
res = dict(gpu=torch.cuda.get_device_name() if device == "cuda" else device, steps=steps, step_ms=round(1e3 * wall / steps, 2),
           gpu_busy_ms_a_step=round(gpu_us / 1e3 / steps, 3), kernels_a_step=launches / steps,
           top_gpu=[(e.key[:80], round(e.self_device_time_total / steps, 1), e.count // steps) for e in top],
           top_cpu_self=[(e.key[:80], round(e.self_cpu_time_total / steps, 1), e.count // steps) for e in cpu_top])
print(json.dumps(res, indent=1))

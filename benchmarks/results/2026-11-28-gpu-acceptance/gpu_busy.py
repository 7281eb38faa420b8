"""MTP chain speculative steps (v32 slice, graphs): step wall time against the GPU's busy time
(union of kernel intervals under torch.profiler), and the host's cProfile of the same steps."""
import argparse, cProfile, io, pstats, time

import torch
from torch.profiler import ProfilerActivity, profile

from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--spec-steps", type=int, default=2)
a = ap.parse_args()
spec = dict(speculative_algorithm="mtp", speculative_num_steps=a.spec_steps) if a.spec_steps else {}
engine = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=a.batch * 48, max_running_requests=a.batch,
                           max_num_batched_tokens=8192, **spec))
gen = torch.Generator().manual_seed(0)
for i in range(a.batch):
    engine.add_request(f"r{i}", torch.randint(2, 128000, (2112,), generator=gen).tolist(),
                       SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True))
seqs = list(engine.sequences.values())
while any(len(s.output_ids) < 4 for s in seqs):
    engine.step()
for _ in range(8):
    engine.step()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(a.steps):
    engine.step()
torch.cuda.synchronize()
wall = 1000 * (time.perf_counter() - t) / a.steps
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(a.steps):
        engine.step()
    torch.cuda.synchronize()
kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA)
busy, end = 0.0, float("-inf")
for s, e in kernels:
    if e > end:
        busy += e - max(s, end)
        end = e
span = (kernels[-1][1] - kernels[0][0]) / 1000 / a.steps
print(f"spec_steps={a.spec_steps} batch={a.batch}: {wall:.2f} ms a step unprofiled; GPU busy {busy / 1000 / a.steps:.2f} ms "
      f"a step of a {span:.2f} ms span, {len(kernels) / a.steps:.0f} kernels a step")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
prof2 = cProfile.Profile()
prof2.enable()
for _ in range(a.steps):
    engine.step()
torch.cuda.synchronize()
prof2.disable()
s = io.StringIO()
pstats.Stats(prof2, stream=s).sort_stats("cumulative").print_stats(30)
print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:7000])

"""Host profile of engine steps (cProfile over timed steps): spec chain of 2, and plain decode; batch 32."""
import argparse, cProfile, io, json, pstats, time
import torch
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--spec", type=int, default=2)
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--out")
a = ap.parse_args()
spec = dict(speculative_algorithm="mtp", speculative_num_steps=a.spec) if a.spec else {}
e = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=a.batch * (2112 // 64 + 8),
                      max_running_requests=a.batch, max_num_batched_tokens=8192, **spec))
g = torch.Generator().manual_seed(0)
for i in range(a.batch):
    e.add_request(f"r{i}", torch.randint(2, 128000, (2112,), generator=g).tolist(),
                  SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True))
seqs = list(e.sequences.values())
while any(len(s.output_ids) < 3 for s in seqs):
    e.step()
for _ in range(3):
    e.step()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(a.steps):
    e.step()
torch.cuda.synchronize()
plain_ms = 1000 * (time.perf_counter() - t) / a.steps
prof = cProfile.Profile()
prof.enable()
for _ in range(a.steps):
    e.step()
torch.cuda.synchronize()
prof.disable()
s = io.StringIO()
st = pstats.Stats(prof, stream=s)
st.sort_stats("tottime").print_stats(30)
st.sort_stats("cumulative").print_stats(45)
print(f"spec {a.spec} batch {a.batch}: {plain_ms:.2f} ms a step unprofiled")
print(s.getvalue())
if a.out:
    open(a.out, "w").write(f"{plain_ms:.3f} ms a step unprofiled\n" + s.getvalue())

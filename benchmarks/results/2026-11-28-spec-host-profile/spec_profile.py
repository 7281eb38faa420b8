"""Host profile of MTP chain speculative steps (v32 slice, graphs): cProfile over timed steps."""
import argparse, cProfile, pstats, io, time, torch
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps", type=int, default=24)
a = ap.parse_args()
engine = Engine(EngineArgs(model=a.model, kv_cache_dtype="fp8", num_kv_pages=a.batch * 48, max_running_requests=a.batch,
                           max_num_batched_tokens=8192, speculative_algorithm="mtp", speculative_num_steps=2))
gen = torch.Generator().manual_seed(0)
for i in range(a.batch):
    engine.add_request(f"r{i}", torch.randint(2, 128000, (2112,), generator=gen).tolist(),
                       SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
seqs = list(engine.sequences.values())
while any(len(s.output_ids) < 4 for s in seqs):
    engine.step()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(a.steps):
    engine.step()
torch.cuda.synchronize()
print(f"plain: {1000 * (time.perf_counter() - t) / a.steps:.2f} ms a step")
prof = cProfile.Profile()
prof.enable()
for _ in range(a.steps):
    engine.step()
torch.cuda.synchronize()
prof.disable()
for key in ("tottime", "cumulative"):
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(28)
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:6000])

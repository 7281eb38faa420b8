"""Session 60: find the multi-second engine step at concurrency 8 (bench_serving's engine-alone side).
Times every engine step, records each step's chunks, every Triton kernel load (jit_cache_hook) and
every CUDA graph capture (the engine's log), and prints the slow steps with what happened in them."""
import logging, sys, time
sys.path.insert(0, "benchmarks")
if "--no-libs" in sys.argv:
    sys.modules["deep_gemm"] = None
    sys.modules["flash_mla"] = None
import torch, triton
from bench_serving import engine_level, workloads
from dsa_backend.engine import Engine
from dsa_backend.serving.engine_config import engine_args
from dsa_backend.serving.fill_template import DEFAULTS
from dsa_backend.tokenizer import Tokenizer

events = []
def hook(**kw):
    events.append((time.perf_counter(), "jit", kw["fn"].name, str(kw.get("repr") or kw.get("key", ""))[:300]))
    return False
triton.knobs.runtime.jit_cache_hook = hook

class Capture(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if "captured" in msg or "compil" in msg.lower() or "warn" in record.levelname.lower():
            events.append((time.perf_counter(), "log", record.name, msg[:300]))
logging.basicConfig(level=logging.INFO)
logging.getLogger().addHandler(Capture())

class A: pass
args = A(); args.concurrency = [1, 8]; args.input_len = 1024; args.output_len = 128; args.waves = 4; args.seed = 0
settings = {**DEFAULTS, "max_running_requests": "64", "model_dir": "/tmp/v32"}
engine = Engine(engine_args(settings, "cuda:0"))
tok = Tokenizer("/tmp/v32")
steps = []
orig_step, orig_sched = engine.step, engine.scheduler.schedule
cur = {}
def schedule():
    chunks = orig_sched()
    cur["chunks"] = [(c.num_tokens, c.start) for c in chunks]
    return chunks
engine.scheduler.schedule = schedule
def step():
    cur.clear(); t = time.perf_counter()
    out = orig_step()
    torch.cuda.synchronize()
    steps.append((t, time.perf_counter() - t, cur.get("chunks", [])))
    return out
engine.step = step
for c, (warm, timed) in workloads(args).items():
    for name, reqs in (("warm", warm), ("timed", timed)):
        n0 = len(steps)
        r = engine_level(engine, [tok.encode(q.prompt) for q in reqs], args.output_len, c)
        slow = [s for s in steps[n0:] if s[1] > 0.25]
        print(f"level {c} {name}: {r['output_tokens_per_s']:.0f} tok/s ttft p99 {r['ttft_s']['p99']:.3f} steps {len(steps)-n0} slow {len(slow)}", flush=True)
        for t, d, ch in slow:
            dec = sum(1 for n, _ in ch if n == 1); pre = [(n, s) for n, s in ch if n > 1]
            print(f"  slow step {d*1e3:.0f} ms: {dec} decode rows, prefill pieces {pre[:6]}{'...' if len(pre)>6 else ''}, max start {max((s for _, s in ch), default=0)}")
            for e in events:
                if t - 0.01 <= e[0] <= t + d:
                    print(f"    +{(e[0]-t)*1e3:.0f} ms {e[1]} {e[2]} {e[3][:240]}")

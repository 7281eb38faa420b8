"""Session 61: an engine on a cold Triton cache, with and without the warm-up; time to ready, then
a mixed workload's kernel loads (the steps that waited on a compile) and its wall time."""
import json, logging, os, random, subprocess, sys, tempfile, time

def one(model, warmup):
    logging.basicConfig(level=logging.INFO if warmup else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("dsa_backend.kernel_loads").setLevel(logging.ERROR)
    from dsa_backend import LLM, SamplingParams
    t = time.perf_counter()
    llm = LLM(model, device="cuda", page_size=64, max_model_len=4096, max_running_requests=16,
              max_num_batched_tokens=512, warmup=warmup)
    ready = time.perf_counter() - t
    rng = random.Random(0)
    t = time.perf_counter()
    waves = []
    for wave in range(4):
        n = rng.choice([3, 7, 12, 16])
        prompts = [[rng.randint(10, 1000) for _ in range(rng.randint(20, 1500))] for _ in range(n)]
        w = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=rng.randint(16, 64), temperature=0))
        s = llm.engine.stats()
        waves.append({"requests": n, "s": round(time.perf_counter() - w, 2), "loads": s["kernel_loads"],
                      "load_s": round(s["kernel_load_seconds"], 2)})
    return {"warmup": warmup, "ready_s": round(ready, 1), "workload_s": round(time.perf_counter() - t, 1), "waves": waves}

if __name__ == "__main__":
    if sys.argv[1] == "one":
        print("RESULT " + json.dumps(one(sys.argv[2], sys.argv[3] == "1")), flush=True); sys.exit()
    model = sys.argv[1]
    for warmup in (0, 1):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "TRITON_CACHE_DIR": f"{tmp}/t", "DG_JIT_CACHE_DIR": f"{tmp}/d"}
            p = subprocess.run([sys.executable, __file__, "one", model, str(warmup)], env=env, capture_output=True,
                               text=True, timeout=170)
            print([l for l in p.stdout.splitlines() if l.startswith("RESULT")] or p.stderr[-3000:], flush=True)
            print("\n".join(l for l in p.stderr.splitlines() if "warm-up" in l), flush=True)

"""Session 61 probe: the warm-up's calls in compile-only mode, serial and on threads, cold cache."""
import json, os, subprocess, sys, tempfile, time, logging
from pathlib import Path

def one(limits, threads, check):
    import torch, triton
    from dsa_backend import warmup
    from dsa_backend.cache import KVCache
    from dsa_backend.config import ModelConfig
    from dsa_backend.tools.make_checkpoint import make_config
    from dsa_kernels.compile_only import compile_only
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = ModelConfig.from_dict(make_config("deepseek_v32", "v32-slice"))
    running, budget, longest = limits
    shapes = warmup.WarmupShapes(running, budget, longest)
    cache = KVCache(config, -(-longest // 64), 64, dtype=torch.bfloat16, kv_cache_dtype="auto", device="cuda")
    names = []
    triton.knobs.runtime.jit_cache_hook = lambda **kw: names.append(kw["fn"].name) and False
    start = time.perf_counter()
    with compile_only(threads):
        calls = warmup.warm_up(cache, config, shapes)
        submitted = time.perf_counter() - start
    torch.cuda.synchronize()
    out = {"limits": limits, "threads": threads, "calls": calls, "s": round(time.perf_counter() - start, 1),
           "submitted_s": round(submitted, 1), "loads": len(names),
           "by_kernel": {n: names.count(n) for n in sorted(set(names))}}
    if check:
        names.clear()
        start = time.perf_counter()
        warmup.warm_up(cache, config, shapes)
        torch.cuda.synchronize()
        out["real_after_s"] = round(time.perf_counter() - start, 1)
        out["loads_after"] = len(names)
        out["loads_after_names"] = sorted(set(names))
    return out

if __name__ == "__main__":
    if sys.argv[1] == "one":
        print("RESULT " + json.dumps(one([int(x) for x in sys.argv[2:5]], int(sys.argv[5]), sys.argv[6] == "1")), flush=True)
        sys.exit()
    import triton, inspect
    from triton.runtime.jit import JITFunction
    print("triton", triton.__version__, inspect.signature(JITFunction.run), flush=True)
    import triton.runtime._async_compile as a; print("async", a.AsyncCompileMode, flush=True)
    runs = [("8 256 16384", 0, 1, 400), ("8 256 16384", 16, 1, 300), ("64 2048 163840", 16, 0, 420)]
    for spec in sys.argv[1:]:
        pass
    plan = json.loads(sys.argv[1]) if sys.argv[1:] else runs
    for limits, threads, check, timeout in plan:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "TRITON_CACHE_DIR": f"{tmp}/t", "DG_JIT_CACHE_DIR": f"{tmp}/d"}
            t = time.time()
            try:
                p = subprocess.run([sys.executable, __file__, "one", *limits.split(), str(threads), str(check)], env=env,
                                   capture_output=True, text=True, timeout=timeout)
                res = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
                print(res[0] if res else "FAILED rc %s %s" % (p.returncode, p.stderr[-3000:]), flush=True)
                print("\n".join(l for l in p.stderr.splitlines() if "warm-up" in l)[-3000:], flush=True)
            except subprocess.TimeoutExpired as e:
                print("TIMEOUT", limits, threads, timeout, (e.stderr or b"")[-2000:], flush=True)
            print("wall", round(time.time() - t, 1), flush=True)

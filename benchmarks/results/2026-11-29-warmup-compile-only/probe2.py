"""Session 61 probe 2: default limits in compile-only mode on threads; every compile timed, failures
named (kernel, constexprs), then retried serially to tell a thread race from a real compile error."""
import json, os, sys, tempfile, time, logging, threading, traceback
from concurrent.futures import ThreadPoolExecutor

def main(limits, threads):
    import torch, triton
    from dsa_backend import warmup
    from dsa_backend.cache import KVCache
    from dsa_backend.config import ModelConfig
    from dsa_backend.tools.make_checkpoint import make_config
    import dsa_kernels.compile_only as co
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    compiles, failures, lock = [], [], threading.Lock()

    def describe(fn):
        for cell in fn.__closure__ or ():
            v = cell.cell_contents
            if type(v).__name__ == "ASTSource":
                return v
        return None

    class Executor(ThreadPoolExecutor):
        def submit(self, fn, *a, **k):
            src = describe(fn)
            def timed():
                t = time.perf_counter()
                try:
                    return fn()
                except Exception as exc:
                    with lock:
                        failures.append((src, fn, traceback.format_exc()[-2500:]))
                    raise
                finally:
                    with lock:
                        compiles.append((src.fn.__name__ if src else "?", time.perf_counter() - t))
            return super().submit(timed, *a, **k)

    co.ThreadPoolExecutor = Executor
    config = ModelConfig.from_dict(make_config("deepseek_v32", "v32-slice"))
    running, budget, longest = limits
    shapes = warmup.WarmupShapes(running, budget, longest)
    cache = KVCache(config, -(-longest // 64), 64, dtype=torch.bfloat16, kv_cache_dtype="auto", device="cuda")
    start = time.perf_counter()
    err = None
    try:
        with co.compile_only(threads):
            warmup.warm_up(cache, config, shapes)
            print("submitted", round(time.perf_counter() - start, 1), flush=True)
    except Exception as exc:
        err = repr(exc)[:300]
    total = time.perf_counter() - start
    by = {}
    for name, s in compiles:
        by.setdefault(name, []).append(s)
    print("RESULT", json.dumps({"limits": limits, "threads": threads, "s": round(total, 1), "error": err,
          "compiles": len(compiles), "compile_s_sum": round(sum(s for _, s in compiles), 1),
          "by_kernel": {n: [len(v), round(sum(v), 1), round(max(v), 2)] for n, v in by.items()},
          "failures": len(failures)}), flush=True)
    for src, fn, tb in failures[:6]:
        print("FAILED", src.fn.__name__ if src else "?", {str(k): v for k, v in (src.constants.items() if src else [])},
              src.signature if src else "", flush=True)
        print(tb, flush=True)
        t = time.perf_counter()
        try:
            fn()
            print("SERIAL RETRY: compiled in %.1f s (a thread race)" % (time.perf_counter() - t), flush=True)
        except Exception:
            print("SERIAL RETRY FAILED too:", traceback.format_exc()[-1500:], flush=True)

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRITON_CACHE_DIR"] = f"{tmp}/t"; os.environ["DG_JIT_CACHE_DIR"] = f"{tmp}/d"
        main([int(x) for x in sys.argv[1:4]], int(sys.argv[4]))

"""How long the start-up warm-up takes from a cold Triton cache, its compiles on threads and one
at a time (dsa_backend/warmup.py, dsa_kernels.compile_only).

    python3 benchmarks/bench_warmup.py --limits 8 256 16384 --threads 16 0 [--warm] [--check] [--json out.json]

--limits are max_running_requests, max_num_batched_tokens and the longest context. Each run is a
process of its own with an empty TRITON_CACHE_DIR (and DG_JIT_CACHE_DIR), over DeepSeek-V3.2's
DSA shapes (the v32-slice config: 64 indexer heads, 128 heads, top-k 2048, page 64). It reports
the warm-up's time and the kernels Triton compiled or loaded in it. --warm runs the same warm-up
again in a new process over the cache the first one filled (a restart). --check then runs every
call of the warm-up once more, launching the kernels, and counts the kernels Triton loads there:
0 means the warm-up left nothing for serving to compile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

from report import emit


def one_run(args) -> dict:
    import torch
    import triton

    from dsa_backend import warmup
    from dsa_backend.cache import KVCache
    from dsa_backend.config import ModelConfig
    from dsa_backend.tools.make_checkpoint import make_config

    config = ModelConfig.from_dict(make_config("deepseek_v32", "v32-slice"))
    running, budget, longest = args.limits
    shapes = warmup.WarmupShapes(running, budget, longest)
    cache = KVCache(config, -(-longest // 64), 64, dtype=torch.bfloat16, kv_cache_dtype=args.kv_cache_dtype,
                    device=args.device)
    loads = []
    triton.knobs.runtime.jit_cache_hook = lambda **kw: loads.append(kw["fn"].name) and False
    start = time.perf_counter()
    calls = warmup.warm_up(cache, config, shapes, args.one)
    out = {"threads": args.one, "seconds": round(time.perf_counter() - start, 1), "calls": calls,
           "loads": len(loads), "kernels": len(set(loads))}
    if args.check:
        loads.clear()
        start = time.perf_counter()
        run = warmup._Runner(cache, config, warmup.default_backend(cache.mla.buffer.device),
                             cache.allocator.allocate(-(-longest // 64)), longest, max_rows=budget)
        for calls in warmup.warmup_calls(shapes, longest, 64).values():
            for call in calls:  # launched, as serving would
                run(call)
        if args.device != "cpu":
            torch.cuda.synchronize()
        out["check_s"] = round(time.perf_counter() - start, 1)
        out["loads_after"] = len(loads)
    return out


def _run(args, threads: int, cache_dir: str) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": f"{cache_dir}/triton", "DG_JIT_CACHE_DIR": f"{cache_dir}/deep_gemm"}
    cmd = [sys.executable, __file__, "--one", str(threads), "--limits", *map(str, args.limits),
           "--kv-cache-dtype", args.kv_cache_dtype, "--device", args.device] + (["--check"] if args.check else [])
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        return {"threads": threads, "error": done.stderr[-2000:]}
    except subprocess.TimeoutExpired:
        return {"threads": threads, "error": f"timed out after {args.timeout_s} s"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limits", type=int, nargs=3, default=[8, 256, 16384],
                        metavar=("REQUESTS", "TOKENS", "CONTEXT"))
    parser.add_argument("--threads", type=int, nargs="+", default=[16, 0])
    parser.add_argument("--warm", action="store_true", help="then the same warm-up again over the filled cache")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--device", default="cuda", help="cpu: the plumbing only (nothing compiles there)")
    parser.add_argument("--check", action="store_true", help="then count the loads of a second full warm-up")
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a run, in its own process
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args)))
        return
    import torch

    runs = []
    for threads in args.threads:
        with tempfile.TemporaryDirectory(prefix="bench-warmup-") as tmp:
            run = {"cold": _run(args, threads, tmp)}
            if args.warm:
                run["warm"] = _run(args, threads, tmp)
        print(json.dumps(run), flush=True)
        runs.append(run)
    emit({"bench": "warmup", "date": datetime.date.today().isoformat(),
          "gpu": torch.cuda.get_device_name() if args.device != "cpu" else "cpu",
          "limits": args.limits, "kv_cache_dtype": args.kv_cache_dtype, "cpus": len(os.sched_getaffinity(0)),
          "runs": runs}, args.json)


if __name__ == "__main__":
    main()

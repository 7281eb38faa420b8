"""How long the start-up warm-up takes from a cold Triton cache, with the engine compiling every
kernel config itself (--workers 0) and with worker processes compiling them (warmup_workers.py).

    python3 benchmarks/bench_warmup.py --limits 8 256 16384 --workers 0 8 [--check] [--json out.json]

--limits are max_running_requests, max_num_batched_tokens and the longest context. Each run is a
process of its own with an empty TRITON_CACHE_DIR (and DG_JIT_CACHE_DIR), over DeepSeek-V3.2's
DSA shapes (the v32-slice config: 64 indexer heads, 128 heads, top-k 2048, page 64). It reports
the workers' time, the engine process's own warm-up time (every call, or the calls the workers
found loading kernels) and their sum. --check then runs every call of the warm-up once more and
counts the kernels Triton loads there: 0 means the warm-up left nothing for serving to compile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import emit


def one_run(args) -> dict:
    import torch
    import triton

    from dsa_backend import warmup, warmup_workers
    from dsa_backend.cache import KVCache
    from dsa_backend.config import ModelConfig
    from dsa_backend.tools.make_checkpoint import make_config

    raw = make_config("deepseek_v32", "v32-slice")
    model_dir = Path(os.environ["TRITON_CACHE_DIR"]).parent / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(raw))
    config = ModelConfig.from_dict(raw)
    running, budget, longest = args.limits
    shapes = warmup.WarmupShapes(running, budget, longest)
    log = []  # the workers' summary line (their times)
    handler = logging.Handler()
    handler.emit = lambda record: log.append(record.getMessage())
    logging.getLogger("dsa_backend.warmup_workers").addHandler(handler)
    logging.getLogger("dsa_backend.warmup_workers").setLevel(logging.INFO)
    start = time.perf_counter()
    loaded = None
    if args.one:
        pools = warmup_workers.WorkerCache(str(model_dir), 64, "bfloat16", args.kv_cache_dtype, args.device)
        loaded = warmup_workers.compile_in_workers(pools, shapes, args.one, config.index_topk)
    workers_s = time.perf_counter() - start
    cache = KVCache(config, -(-longest // 64), 64, dtype=torch.bfloat16, kv_cache_dtype=args.kv_cache_dtype,
                    device=args.device)
    calls = warmup.warm_up(cache, config, shapes, calls=loaded)
    if args.device != "cpu":
        torch.cuda.synchronize()
    out = {"workers": args.one, "workers_s": round(workers_s, 1), "total_s": round(time.perf_counter() - start, 1),
           "engine_calls": calls, "every_call": sum(len(c) for c in warmup.warmup_calls(shapes, longest, 64).values())}
    out["engine_s"] = round(out["total_s"] - out["workers_s"], 1)
    out["workers_log"] = log
    if args.check:
        loads = []
        triton.knobs.runtime.jit_cache_hook = lambda **kw: loads.append(kw["fn"].name) and False
        warmup.warm_up(cache, config, shapes)
        out["loads_after"] = len(loads)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limits", type=int, nargs=3, default=[8, 256, 16384],
                        metavar=("REQUESTS", "TOKENS", "CONTEXT"))
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 8])
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
    for workers in args.workers:
        with tempfile.TemporaryDirectory(prefix="bench-warmup-") as tmp:
            env = {**os.environ, "TRITON_CACHE_DIR": f"{tmp}/triton", "DG_JIT_CACHE_DIR": f"{tmp}/deep_gemm"}
            cmd = [sys.executable, __file__, "--one", str(workers), "--limits", *map(str, args.limits),
                   "--kv-cache-dtype", args.kv_cache_dtype, "--device", args.device] + (["--check"] if args.check else [])
            try:
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
                run = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
                    "workers": workers, "error": done.stderr[-2000:]}
            except subprocess.TimeoutExpired:
                run = {"workers": workers, "error": f"timed out after {args.timeout_s} s"}
        print(json.dumps(run), flush=True)
        runs.append(run)
    serial = next((r["total_s"] for r in runs if r.get("workers") == 0 and "total_s" in r), None)
    for r in runs:
        if serial and "total_s" in r:
            r["speedup_over_serial"] = round(serial / r["total_s"], 2)
    emit({"bench": "warmup", "date": datetime.date.today().isoformat(),
          "gpu": torch.cuda.get_device_name() if args.device != "cpu" else "cpu",
          "limits": args.limits, "kv_cache_dtype": args.kv_cache_dtype, "cpus": len(os.sched_getaffinity(0)),
          "runs": runs}, args.json)


if __name__ == "__main__":
    main()

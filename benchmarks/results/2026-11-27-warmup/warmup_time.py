"""Warm-up at the engine's default limits (64 requests, 2048 tokens a step, DeepSeek-V3.2's 163840
context), DeepSeek-V3.2 DSA shapes: calls, seconds, Triton compiles during it. argv: kv_cache_dtype,
tokens_per_verify."""
import json, os, sys, time
import logging
import torch, triton
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
from dsa_backend import warmup
from dsa_backend.cache import KVCache
from dsa_backend.config import ModelConfig
from dsa_backend.tools.make_checkpoint import make_config

kv, n = sys.argv[1], int(sys.argv[2])
running, budget, longest = (int(x) for x in sys.argv[3:6])
config = ModelConfig.from_dict(make_config("deepseek_v32", "v32-slice"))
cache = KVCache(config, longest // 64 + 40, 64, dtype=torch.bfloat16, kv_cache_dtype=kv, device="cuda")
compiled = []
triton.knobs.runtime.jit_cache_hook = lambda **kw: compiled.append(kw["fn"].name) and False
t = time.perf_counter()
calls = warmup.warm_up(cache, config, warmup.WarmupShapes(running, budget, longest, tokens_per_verify=n))
row = dict(running=running, budget=budget, longest=longest, kv_cache_dtype=kv, tokens_per_verify=n, calls=calls, seconds=round(time.perf_counter() - t, 1),
           compiles=len(compiled), by_kernel={k: compiled.count(k) for k in sorted(set(compiled))},
           peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2), cache=os.environ.get("TRITON_CACHE_DIR"))
print(json.dumps(row), flush=True)
with open(os.path.join(os.environ["OUT"], f"warmup-{kv}-{n}-{int(time.time())}.json"), "w") as f:
    json.dump(row, f)

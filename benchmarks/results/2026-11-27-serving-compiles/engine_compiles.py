"""Which decode steps of bench_engine's kernel run are slow, and what Triton compiles inside them
(a cold TRITON_CACHE_DIR reproduces a fresh machine)."""
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import bench_engine  # noqa: E402
from dsa_backend.attention import KernelDsaBackend  # noqa: E402
from dsa_backend.engine import Engine, EngineArgs  # noqa: E402

import triton.runtime.jit as tjit  # noqa: E402

_do_compile = tjit.JITFunction._do_compile


def logged_compile(self, key, signature, device, constexprs, options, attrs, warmup):
    t = time.perf_counter()
    out = _do_compile(self, key, signature, device, constexprs, options, attrs, warmup)
    print(f"  compile {self.fn.__qualname__} {1e3 * (time.perf_counter() - t):.0f} ms key={str(key)[:700]}", flush=True)
    return out


tjit.JITFunction._do_compile = logged_compile

model, batch, prompt_len = sys.argv[1], 32, 2112
pages = batch * (-(-(prompt_len + bench_engine._MAX_TOKENS) // 64)) + 8
engine = Engine(EngineArgs(model=model, device="cuda", kv_cache_dtype="fp8", num_kv_pages=pages,
                           max_running_requests=batch, max_num_batched_tokens=8192))
step = engine.step
n = [0]


def timed_step():
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = step()
    torch.cuda.synchronize()
    n[0] += 1
    print(f"step {n[0]}: {1e3 * (time.perf_counter() - t):.1f} ms, {len(out)} outputs", flush=True)
    return out


engine.step = timed_step
for rnd in range(2):
    print(f"=== round {rnd}", flush=True)
    print(bench_engine.decode_throughput(engine, KernelDsaBackend(), batch, prompt_len, 16, 2, f"k{rnd}"), flush=True)

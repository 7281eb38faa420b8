"""Where the host time of our paged indexer and top-k calls goes: each step of the wrappers timed
alone (100 calls, µs a call), then cProfile by cumulative time."""

import cProfile
import io
import pstats
import time

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

import dsa_kernels
from dsa_kernels import indexer_gluon, indexer_logits

PAGE = 64
dev = torch.device("cuda")
pool = torch.zeros(4096, PAGE * 132, dtype=torch.uint8, device=dev)
table = torch.arange(32 * 64, device=dev, dtype=torch.int32).view(32, 64)
q = torch.randn(32, 64, 128, device=dev).to(torch.float8_e4m3fn)
w = torch.randn(32, 64, device=dev)
ctx = torch.full((32,), 4096, dtype=torch.int32, device=dev)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
cfg = indexer_logits.gluon_paged_config(dev, 32, 4096, 1, PAGE)
kl = gl.NVMMASharedLayout.get_default_for([1, 64, 128], gl.float8e4nv)


def host_us(fn, n=100):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return round(us, 1)


steps = {
    "torch.cuda.get_device_properties": lambda: torch.cuda.get_device_properties(dev).multi_processor_count,
    "gluon_paged_config": lambda: indexer_logits.gluon_paged_config(dev, 32, 4096, 1, PAGE),
    "pool_parts": lambda: indexer_logits.pool_parts(pool, PAGE),
    "NVMMASharedLayout.get_default_for": lambda: gl.NVMMASharedLayout.get_default_for([1, 64, 128], gl.float8e4nv),
    "TensorDescriptor.from_tensor (layout given)": lambda: TensorDescriptor.from_tensor(keys, [1, 64, 128], kl),
    "torch.empty logits": lambda: torch.empty(32, 4096, device=dev),
    "_logits_eviction": lambda: indexer_gluon._logits_eviction(torch.empty(32, 4096, device=dev)),
    "indexer_gluon.paged_indexer_logits": lambda: indexer_gluon.paged_indexer_logits(
        q, w, keys, scales, table, ctx, 4096, 1, False, cfg),
    "indexer_logits.paged_indexer_logits": lambda: indexer_logits.paged_indexer_logits(
        q, w, pool, table, ctx, PAGE, 4096, 1, False),
    "dispatch ours": lambda: dsa_kernels.paged_indexer_logits(q, w, pool, table, ctx, page_size=PAGE,
                                                              max_context_len=4096, clean_logits=False, backend="ours"),
}
for name, fn in steps.items():
    print(f"{host_us(fn):8.1f} us  {name}", flush=True)

prof = cProfile.Profile()
prof.enable()
for _ in range(100):
    steps["dispatch ours"]()
prof.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
print(s.getvalue()[:9000])

"""Host time a call of the dispatch's entry points, as an eager engine pays it per layer: enqueue
time of 100 calls with the GPU left to run behind, median of 7 repeats, µs a call. HOST_TAG names
the output ($OUT/host_us_TAG.json); call2.sh runs it on the kernels before and after, alternating."""

import json
import os
import statistics
import time

import torch

import dsa_kernels

PAGE = 64
dev = "cuda"


def host_us(fn, n=100, repeats=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(runs), 1)


pool = torch.zeros(4096, PAGE * 132, dtype=torch.uint8, device=dev)
table = torch.arange(32 * 64, device=dev, dtype=torch.int32).view(32, 64)
q = torch.randn(32, 64, 128, device=dev).to(torch.float8_e4m3fn)
w = torch.randn(32, 64, device=dev)
ctx = torch.full((32, 1), 4096, dtype=torch.int32, device=dev)
logits = torch.randn(32, 4096, device=dev)
lens = torch.full((32,), 4096, dtype=torch.int32, device=dev)
long_logits = torch.randn(8, 32768, device=dev)
long_lens = torch.full((8,), 32768, dtype=torch.int32, device=dev)
zeros = torch.zeros(32, dtype=torch.int32, device=dev)
mla_pool = torch.zeros(16384, 656, dtype=torch.uint8, device=dev)
q64 = torch.randn(32, 64, 576, device=dev).bfloat16()
q128 = torch.randn(128, 128, 576, device=dev).bfloat16()
idx32 = torch.randint(0, 16384, (32, 2048), device=dev, dtype=torch.int32)
idx128 = torch.randint(0, 16384, (128, 2048), device=dev, dtype=torch.int32)


def indexer(next_n, backend):
    return lambda: dsa_kernels.paged_indexer_logits(q, w, pool, table[: 32 // next_n], ctx, page_size=PAGE,
                                                    max_context_len=4096, next_n=next_n, clean_logits=False,
                                                    backend=backend)


calls = {
    "empty torch.add": lambda: torch.add(zeros, 1),
    "indexer ours, 32 x 4K, next_n 1": indexer(1, "ours"),
    "indexer ours, 16 x 4K, next_n 2": indexer(2, "ours"),
    "indexer DeepGEMM (auto), 32 x 4K, next_n 1": indexer(1, "auto"),
    "top-k paged, 32 x 4K": lambda: dsa_kernels.topk_transform(logits, lens, 2048, "paged", block_table=table,
                                                               page_size=PAGE),
    "top-k ragged, 8 x 32K": lambda: dsa_kernels.topk_transform(long_logits, long_lens, 2048, "ragged",
                                                                offsets=zeros[:8]),
    "sparse MLA ours, FP8, 32 x 64 heads (split 4 + merge)": lambda: dsa_kernels.sparse_mla_decode(
        q64, mla_pool, idx32, 0.1, backend="triton"),
    "sparse MLA ours, FP8, 128 x 128 heads": lambda: dsa_kernels.sparse_mla_decode(q128, mla_pool, idx128, 0.1,
                                                                                  backend="triton"),
    "FlashMLA (auto), FP8, 32 x 64 heads": lambda: dsa_kernels.sparse_mla_decode(q64, mla_pool, idx32, 0.1),
    "FlashMLA (auto), FP8, 128 x 128 heads": lambda: dsa_kernels.sparse_mla_decode(q128, mla_pool, idx128, 0.1),
}
res = {}
for name, fn in calls.items():
    res[name] = host_us(fn)
    print(f"{res[name]:8.1f} us  {name}", flush=True)
with open(os.path.join(os.environ.get("OUT", "."), f"host_us_{os.environ.get('HOST_TAG', 'run')}.json"), "w") as f:
    json.dump(res, f, indent=1)

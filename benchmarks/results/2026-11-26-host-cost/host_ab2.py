"""Host time a call, the kernels before (package dsa_kernels_before) and after (dsa_kernels) in one
process, alternating every 100 calls, so that the device machine's host noise (up to 2x between and
within processes) falls on both alike: enqueue time of 100 calls with the GPU left to run behind,
21 rounds; per entry the minimum and median of each side and the median of the 21 after / before
ratios of adjacent runs. Writes $OUT/host_ab.json."""

import importlib
import json
import os
import statistics
import time

import torch

sides = {"before": importlib.import_module("dsa_kernels_before"), "after": importlib.import_module("dsa_kernels")}
PAGE = 64
dev = "cuda"
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


def entries(dk):
    def indexer(next_n, backend):
        return lambda: dk.paged_indexer_logits(q, w, pool, table[: 32 // next_n], ctx, page_size=PAGE,
                                               max_context_len=4096, next_n=next_n, clean_logits=False,
                                               backend=backend)
    return {
        "indexer ours, 32 x 4K, next_n 1": indexer(1, "ours"),
        "indexer ours, 16 x 4K, next_n 2": indexer(2, "ours"),
        "indexer DeepGEMM (auto), 32 x 4K, next_n 1": indexer(1, "auto"),
        "top-k paged, 32 x 4K": lambda: dk.topk_transform(logits, lens, 2048, "paged", block_table=table,
                                                          page_size=PAGE),
        "top-k ragged, 8 x 32K": lambda: dk.topk_transform(long_logits, long_lens, 2048, "ragged",
                                                           offsets=zeros[:8]),
        "sparse MLA ours, FP8, 32 x 64 heads (split 4 + merge)": lambda: dk.sparse_mla_decode(
            q64, mla_pool, idx32, 0.1, backend="triton"),
        "sparse MLA ours, FP8, 128 x 128 heads": lambda: dk.sparse_mla_decode(q128, mla_pool, idx128, 0.1,
                                                                             backend="triton"),
        "FlashMLA (auto), FP8, 32 x 64 heads": lambda: dk.sparse_mla_decode(q64, mla_pool, idx32, 0.1),
        "empty torch.add": lambda: torch.add(zeros, 1),
    }


def run_us(fn, n=100):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


calls = {side: entries(dk) for side, dk in sides.items()}
res = {"gpu": torch.cuda.get_device_name(), "rounds": 21}
for name in calls["after"]:
    for side in sides:
        for _ in range(3):
            calls[side][name]()
    torch.cuda.synchronize()
    times = {side: [] for side in sides}
    for _ in range(21):
        for side in sides:
            times[side].append(run_us(calls[side][name]))
    ratio = statistics.median(a / b for a, b in zip(times["after"], times["before"]))
    res[name] = {**{f"{side}_min": round(min(t), 1) for side, t in times.items()},
                 **{f"{side}_median": round(statistics.median(t), 1) for side, t in times.items()},
                 "after_over_before": round(ratio, 3)}
    print(json.dumps({name: res[name]}), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "host_ab.json"), "w") as f:
    json.dump(res, f, indent=1)

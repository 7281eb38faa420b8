"""Host time a call of the dispatch's entry points (what an eager engine pays per layer): enqueue
time of 100 calls with the GPU left to run behind. HOST_TAG names the output file (host_us_TAG.json)."""

import json
import os
import time

import torch

import dsa_kernels

PAGE = 64
dev = "cuda"
logits = torch.randn(256, 32768, device=dev)
lens = torch.full((256, 1), 32768, dtype=torch.int32, device=dev)
zeros = torch.zeros(256, dtype=torch.int32, device=dev)
pool = torch.zeros(4096, PAGE * 132, dtype=torch.uint8, device=dev)
table = torch.arange(32 * 64, device=dev, dtype=torch.int32).view(32, 64)
q = torch.randn(32, 64, 128, device=dev).to(torch.float8_e4m3fn)
w = torch.randn(32, 64, device=dev)
ctx = torch.full((32, 1), 4096, dtype=torch.int32, device=dev)
mla_pool = torch.zeros(8192, 656, dtype=torch.uint8, device=dev)
qa = torch.randn(32, 64, 576, device=dev).bfloat16()
idx = torch.randint(0, 8192, (32, 2048), device=dev, dtype=torch.int32)
calls = {
    "topk_transform ragged 256 x 32K": lambda: dsa_kernels.topk_transform(logits, lens, 2048, "ragged", offsets=zeros),
    "topk_transform ragged 8 x 32K": lambda: dsa_kernels.topk_transform(logits[:8], lens[:8], 2048, "ragged",
                                                                       offsets=zeros[:8]),
    "paged_indexer_logits auto 32 x 4K": lambda: dsa_kernels.paged_indexer_logits(
        q, w, pool, table, ctx, page_size=PAGE, max_context_len=4096, clean_logits=False),
    "paged_indexer_logits ours 32 x 4K": lambda: dsa_kernels.paged_indexer_logits(
        q, w, pool, table, ctx, page_size=PAGE, max_context_len=4096, clean_logits=False, backend="ours"),
    "sparse_mla_decode auto fp8 32 x 64 heads": lambda: dsa_kernels.sparse_mla_decode(qa, mla_pool, idx, 0.1),
    "sparse_mla_decode triton fp8 32 x 64 heads": lambda: dsa_kernels.sparse_mla_decode(qa, mla_pool, idx, 0.1,
                                                                                         backend="triton"),
    "empty launch (torch.add)": lambda: torch.add(zeros, 1),
}
res = {}
for name, fn in calls.items():
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(100):
        fn()
    host = (time.perf_counter() - t) / 100
    torch.cuda.synchronize()
    res[name] = round(host * 1e6, 1)
    print(json.dumps({name: res[name]}), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), f"host_us_{os.environ.get('HOST_TAG', 'run')}.json"), "w") as f:
    json.dump(res, f, indent=1)

"""Why the eager tree path's top-k looked slow: topk_transform (ragged, k 2048) over rows of 32K
logits, eager (triton do_bench, L2 flushed before each call; and 50 calls back to back) against a
CUDA graph, for row counts the tree A/B had. µs a call."""

import json
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

import dsa_kernels  # noqa: E402


def back_to_back(fn, calls=50):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


rows_out = []
for rows, width in [(8, 32768), (32, 32768), (256, 32768), (512, 32768), (1024, 32768), (128, 4096), (1024, 4096)]:
    logits = torch.randn(rows, width, device="cuda")
    lens = torch.full((rows, 1), width, dtype=torch.int32, device="cuda")
    zeros = torch.zeros(rows, dtype=torch.int32, device="cuda")

    def fn():
        return dsa_kernels.topk_transform(logits, lens, 2048, "ragged", offsets=zeros)

    fn()
    r = dict(rows=rows, width=width,
             eager_flushed=round(1000 * triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"), 1),
             eager_back_to_back=round(1000 * back_to_back(fn), 1),
             graph=round(1000 * graph_ms(fn, rep_ms=15), 1))
    print(json.dumps(r), flush=True)
    rows_out.append(r)
with open(os.path.join(os.environ.get("OUT", "."), "eager_topk.json"), "w") as f:
    json.dump(rows_out, f, indent=1)

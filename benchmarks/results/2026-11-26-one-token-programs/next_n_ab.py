"""The paged indexer's default path at next_n 3 and above 4 (Gluon programs of one or two of a
request's tokens) against the Triton kernel that served those next_n before (its paged_config), at
bench_kernels' shapes; next_n 1 and 4 on the default path for the cost ratios. NEXT_NS picks the
next_n (call 2: 1 3 4 5 8, when every one of them took one token a program; call 4: 1 3 4 5 6 7 8). CUDA-graph medians, alternating, best of
two; logits compared bit for bit inside each token's length."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_logits  # noqa: E402

PAGE = 64
SHAPES = [(b, c) for c in (4096, 32768, 131072) for b in (1, 32, 128)]
pool = torch.empty(128 * 131072 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
rows = []
for batch, ctx in SHAPES:
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    seq = torch.full((batch,), ctx, device="cuda")
    base = None
    for next_n in [int(x) for x in os.environ.get("NEXT_NS", "1 3 4 5 8").split()]:
        if batch * next_n * ctx * 4 > 2**30:  # logits over 1 GiB: 128 / 128K at next_n 3 and up
            continue
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]

        def run(config=None):
            return indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False,
                                                       config=config)

        fns = {"default": run}
        if next_n not in (1, 4):
            fns["triton"] = lambda: run(indexer_logits.paged_config(batch, ctx, next_n, page_size=PAGE))
        want = fns["default"]()
        same = {k: bool(torch.equal(f()[inside], want[inside])) for k, f in fns.items()}
        times = {k: [] for k in fns}
        for _ in range(2):
            for k, f in fns.items():
                times[k].append(graph_ms(f, rep_ms=15))
        us = {k: round(min(v) * 1000, 2) for k, v in times.items()}
        base = us["default"] if next_n == 1 else base
        row = dict(batch=batch, ctx=ctx, next_n=next_n, us=us, same=same, cost=round(us["default"] / base, 3),
                   tokens_a_program=indexer_logits.gluon_paged_config(q.device, batch, ctx, next_n, PAGE).get(
                       "TOKENS_A_PROGRAM"),
                   speedup=us.get("triton") and round(us["triton"] / us["default"], 3))
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "next_n_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)

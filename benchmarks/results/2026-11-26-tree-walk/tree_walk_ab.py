"""Tree verify's indexer call (KernelDsaBackend._tree_topk, every token scoring every key of its
request): one walk a token (next_n 1 over a copy of its request's table row, as before; the
dispatch gives that to DeepGEMM where it loads, and ours is timed too) against one walk a request
(the request's table, next_n = tree size, attention.shared_page_walk; ours, as DeepGEMM takes only
next_n 1 and 2), at DeepSeek-V3.2 indexer shapes (64 heads x 128, page 64). CUDA-graph medians,
alternating, best of two. Ours is compared bit for bit between the two walks, DeepGEMM within
1e-3 of the largest logit. Keys replayed from one block table (small grids read L2)."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import dispatch  # noqa: E402

PAGE = 64
SHAPES = [(1, 32768), (32, 4096), (32, 32768), (128, 4096), (128, 32768), (32, 131072)]
TREES = [4, 8, 16]
pool = torch.empty(128 * 32768 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
rows = []
for batch, ctx in SHAPES:
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    for n in TREES:
        if batch * n * ctx * 4 > 2**30:
            continue
        request = torch.arange(batch, device="cuda").repeat_interleave(n)
        every_key = torch.full((batch * n, 1), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(batch * n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * n, 64, device="cuda") * 0.1
        def token_walks(backend):
            return dispatch.paged_indexer_logits(q, w, pool, table[request].contiguous(), every_key, page_size=PAGE,
                                                 max_context_len=ctx, next_n=1, backend=backend)

        fns = {
            "token_walks": lambda: token_walks("auto"),
            "token_walks_ours": lambda: token_walks("triton"),
            "request_walks": lambda: dispatch.paged_indexer_logits(q, w, pool, table, every_key, page_size=PAGE,
                                                                   max_context_len=ctx, next_n=n),
        }
        want = fns["request_walks"]()
        same = bool(torch.equal(fns["token_walks_ours"](), want))
        auto = fns["token_walks"]()
        close = float((auto - want).nan_to_num(0, 0, 0).abs().max() / want.nan_to_num(0, 0, 0).abs().max())
        times = {k: [] for k in fns}
        for _ in range(2):
            for k, f in fns.items():
                times[k].append(graph_ms(f, rep_ms=15))
        us = {k: round(min(v) * 1000, 2) for k, v in times.items()}
        row = dict(batch=batch, ctx=ctx, tree=n, us=us, ours_same_bits=same, auto_max_rel_diff=close,
                   speedup=round(us["token_walks"] / us["request_walks"], 3),
                   speedup_over_ours=round(us["token_walks_ours"] / us["request_walks"], 3))
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "tree_walk_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)

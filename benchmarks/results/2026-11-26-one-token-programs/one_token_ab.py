"""A/B: the paged indexer at next_n 2 / 3 / 4 on small grids, as it runs now (the Gluon kernel's
next_n programs, or the Triton kernel at next_n 3) against one program a query token (ONE_TOKEN:
next_n 1 programs whose block-table row is token // next_n, so a request's tokens walk its pages
in separate programs and the second read of a page comes from L2). The one-token chunk is what
gluon_config gives next_n 1 at batch * next_n rows, and half and twice that. next_n 1 at the same
batch is timed too, for the cost ratio. CUDA-graph medians, alternating, best of two; logits
compared bit for bit inside each token's length."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = [(1, 4096), (1, 32768), (1, 131072), (2, 8192), (2, 32768), (2, 131072), (4, 8192), (4, 32768),
          (4, 131072), (8, 8192), (8, 32768), (16, 8192), (16, 32768), (32, 4096), (32, 8192), (64, 4096),
          (128, 4096), (32, 32768)]
pool = torch.empty(32 * 32768 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    assert batch * ctx // PAGE <= pool.shape[0]
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    seq = torch.full((batch,), ctx, device="cuda")
    base_ms = None
    for next_n in (1, 2, 3, 4):
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]

        def default():
            return indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False)

        fns = {"now": default}
        kpp = indexer_gluon.gluon_config(batch * next_n, ctx, 1, SMS)["KEYS_PER_PROG"]
        if next_n > 1:
            for k in sorted({max(64, kpp // 2), kpp, min(2048, kpp * 2)}):
                cfg = dict(KEYS_PER_PROG=k, STAGES=4, OVERLAP=True, UNROLLED=False, ONE_TOKEN=True)
                fns[f"one token {k}"] = (lambda cfg=cfg: indexer_gluon.paged_indexer_logits(
                    q, w, keys, scales, table, lens, ctx, next_n, False, cfg))
        want = default()
        same = {k: bool(torch.equal(f()[inside], want[inside])) for k, f in fns.items()}
        times = {k: [] for k in fns}
        for _ in range(2):
            for k, f in fns.items():
                times[k].append(graph_ms(f, rep_ms=15))
        best = {k: round(min(v) * 1000, 2) for k, v in times.items()}  # µs
        if next_n == 1:
            base_ms = best["now"]
        one = min((v, k) for k, v in best.items() if k != "now") if next_n > 1 else (None, None)
        row = dict(batch=batch, ctx=ctx, next_n=next_n, now_cfg=indexer_gluon.gluon_config(batch, ctx, next_n, SMS),
                   rule_one_token_kpp=kpp, us=best, same=same, cost_now=round(best["now"] / base_ms, 3),
                   cost_one_token_best=one[0] and round(one[0] / base_ms, 3), best_one=one[1],
                   speedup_best=one[0] and round(best["now"] / one[0], 3))
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "one_token_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)

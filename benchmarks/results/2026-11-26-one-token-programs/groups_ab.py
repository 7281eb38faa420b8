"""next_n 3, 5, 6 and 8 on the Gluon kernel with a request's tokens in programs of one, two or
four (TOKENS_A_PROGRAM; the last program of a request ends at its last token, so it may repeat
tokens of the one before). Each variant takes the config gluon_config gives its own program shape
(next_n 1 / 2 / 4 at batch * programs a request). next_n 1, 2 and 4 on the default path for the
cost ratios. CUDA-graph medians, alternating, best of two; logits compared bit for bit inside each
token's length against one token a program (the committed path)."""

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = [(b, c) for c in (4096, 32768, 131072) for b in (1, 32, 128)] + [(2, 32768), (8, 8192)]
pool = torch.empty(128 * 131072 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    seq = torch.full((batch,), ctx, device="cuda")
    base = None
    for next_n in (1, 2, 4, 3, 5, 6, 8):
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]

        def default():
            return indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False)

        fns, cfgs = {"default": default}, {}
        if next_n not in (1, 2, 4):
            for per in (1, 2, 4):
                if per >= next_n:
                    continue
                cfg = dict(indexer_gluon.gluon_config(batch * triton.cdiv(next_n, per), ctx, per, SMS),
                           TOKENS_A_PROGRAM=per)
                cfgs[per] = cfg
                fns[f"{per} a program"] = (lambda cfg=cfg: indexer_gluon.paged_indexer_logits(
                    q, w, keys, scales, table, lens, ctx, next_n, False, cfg))
        want = default()
        same = {k: bool(torch.equal(f()[inside], want[inside])) for k, f in fns.items()}
        times = {k: [] for k in fns}
        for _ in range(2):
            for k, f in fns.items():
                times[k].append(graph_ms(f, rep_ms=15))
        us = {k: round(min(v) * 1000, 2) for k, v in times.items()}
        base = us["default"] if next_n == 1 else base
        row = dict(batch=batch, ctx=ctx, next_n=next_n, us=us, same=same,
                   cost={k: round(v / base, 3) for k, v in us.items()},
                   chunks={p: c["KEYS_PER_PROG"] for p, c in cfgs.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "groups_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)

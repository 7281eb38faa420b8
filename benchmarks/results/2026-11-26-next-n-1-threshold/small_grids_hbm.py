"""The small-grid rules from HBM (as threshold_sweep_hbm.py: each graph's calls rotate over block
tables three times L2): next_n 2 and 4 with overlapped programs of 64 to 1024 keys (the
thirtieth session chose their chunks with the keys in L2), and next_n 3, 5 and 6 in programs of
one token and of two (this session's rule, also chosen in L2), each with the config its program
shape gets. NEXT_NS picks the next_n (call 3: 1 2 4 3 5 6; call 4: 7 8). CUDA-graph medians,
alternating, best of two; logits compared bit for bit."""

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
L2 = torch.cuda.get_device_properties(0).L2_cache_size
SHAPES = [(1, 32768), (1, 131072), (2, 32768), (8, 8192), (32, 4096), (4, 32768)]
POOL_PAGES = 2**30 * 2 // (PAGE * 132)
pool = torch.empty(POOL_PAGES, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    pages = batch * ctx // PAGE
    rotation = max(2, -(-3 * L2 // (pages * PAGE * 132)))
    tables = torch.randperm(POOL_PAGES, device="cuda")[: rotation * pages].view(rotation, batch, -1).int()
    seq = torch.full((batch,), ctx, device="cuda")
    for next_n in [int(x) for x in os.environ.get("NEXT_NS", "1 2 4 3 5 6").split()]:
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        state = {"i": 0}

        def run(cfg, table=None):
            if table is None:
                state["i"] = (state["i"] + 1) % rotation
                table = tables[state["i"]]
            return indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, next_n, False, cfg)

        rule = indexer_gluon.gluon_config(batch, ctx, next_n, SMS)
        if next_n in (1, 2, 4):
            cfgs = {f"{k} keys": dict(KEYS_PER_PROG=k, STAGES=4, OVERLAP=True, UNROLLED=False)
                    for k in (64, 128, 256, 512, 1024)}
        else:
            cfgs = {f"{per} a program": dict(indexer_gluon.gluon_config(batch * triton.cdiv(next_n, per), ctx, per, SMS),
                                             TOKENS_A_PROGRAM=per) for per in (1, 2)}
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
        want = run(rule, tables[0])
        same = {k: bool(torch.equal(run(c, tables[0])[inside], want[inside])) for k, c in cfgs.items()}
        times = {k: [] for k in cfgs}
        for _ in range(2):
            for k, c in cfgs.items():
                times[k].append(graph_ms(lambda c=c: run(c), rep_ms=15))
        us = {k: round(min(v) * 1000, 2) for k, v in times.items()}
        picked = next(k for k, c in cfgs.items() if c == rule) if rule in cfgs.values() else None
        row = dict(batch=batch, ctx=ctx, next_n=next_n, rotation=rotation, rule=rule, picked=picked, us=us,
                   same=same, best=min(us, key=us.get),
                   rule_over_best=picked and round(us[picked] / min(us.values()), 3))
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "small_grids_hbm.json"), "w") as f:
    json.dump(rows, f, indent=1)

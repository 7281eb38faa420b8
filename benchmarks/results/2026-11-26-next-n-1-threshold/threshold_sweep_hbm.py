"""threshold_sweep.py's grids (and a few smaller ones) with the keys read from HBM: each graph's
calls rotate over enough block tables, each over pages of its own, that one rotation's keys are
at least three times L2 (an engine's layers read their own keys, so a layer's keys are not in L2
when its indexer runs). Chunks of 128 to 2048 keys, as threshold_sweep.py. CUDA-graph medians,
alternating, best of two; logits compared bit for bit."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
L2 = torch.cuda.get_device_properties(0).L2_cache_size
SHAPES = [(1, 32768), (1, 131072), (8, 8192), (32, 4096), (4, 32768), (8, 32768), (9, 32768), (10, 32768),
          (11, 32768), (12, 32768), (13, 32768), (64, 4096), (80, 4096), (96, 4096), (2, 131072), (3, 131072)]
POOL_PAGES = 2**30 * 2 // (PAGE * 132)  # 2 GiB
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
    assert rotation * pages <= POOL_PAGES
    tables = torch.randperm(POOL_PAGES, device="cuda")[: rotation * pages].view(rotation, batch, -1).int()
    lens = torch.full((batch,), ctx, device="cuda").int()
    q = torch.randn(batch, 64, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch, 64, device="cuda") * 0.1
    rule = indexer_gluon.gluon_config(batch, ctx, 1, SMS)["KEYS_PER_PROG"]
    state = {"i": 0}

    def run(k, table=None):
        if table is None:
            state["i"] = (state["i"] + 1) % rotation
            table = tables[state["i"]]
        return indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, 1, False,
                                                  dict(KEYS_PER_PROG=k, STAGES=4, OVERLAP=True, UNROLLED=False))

    chunks = (128, 256, 512, 1024, 2048)
    want = run(rule, tables[0])
    same = {k: bool(torch.equal(run(k, tables[0]), want)) for k in chunks}
    times = {k: [] for k in chunks}
    for _ in range(2):
        for k in chunks:
            times[k].append(graph_ms(lambda k=k: run(k), rep_ms=15))
    us = {k: round(min(v) * 1000, 2) for k, v in times.items()}
    row = dict(batch=batch, ctx=ctx, rotation=rotation, programs_1024_per_sm=round(batch * -(-ctx // 1024) / SMS, 2),
               rule=rule, us=us, same=same, best=min(us, key=us.get), rule_over_best=round(us[rule] / min(us.values()), 3))
    print(json.dumps(row), flush=True)
    rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "threshold_sweep_hbm.json"), "w") as f:
    json.dump(rows, f, indent=1)

"""next_n 2 / 4 on small grids (batch 1 at 4K-128K, batch 32 and 128 at 4K), where the default
path's next_n 4 costs 1.6-1.8x next_n 1: every Gluon key chunk and schedule, and the Triton kernel's
chunks, warps and stages, against next_n 1's default path, CUDA-graph medians through
benchmarks/graph_timing.py. Each variant's logits are compared with the default's bit for bit
inside each row's length (clean_logits off, as the engine and bench_kernels call it)."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

PAGE = 64
SHAPES = [(1, 4096), (1, 32768), (1, 131072), (32, 4096), (128, 4096), (8, 32768)]


def case(batch, ctx, next_n, pool):
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    seq = torch.full((batch,), ctx, device="cuda")
    lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
    q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
    return q, w, table, lens


def variants(next_n):
    out = {}
    for kpp in (256, 512, 1024, 2048):
        tiles = kpp // 64
        out[f"gluon overlap {kpp}"] = ("gluon", dict(KEYS_PER_PROG=kpp, STAGES=min(4, tiles), OVERLAP=True,
                                                     UNROLLED=False))
        if kpp <= 1024:
            out[f"gluon one-mma {kpp}"] = ("gluon", dict(KEYS_PER_PROG=kpp, STAGES=2, OVERLAP=False,
                                                         UNROLLED=next_n == 2))
    for kpp in (256, 512, 1024):
        for warps, stages in ((4, 2), (8, 3), (8, 2)):
            out[f"triton {kpp} w{warps} s{stages}"] = ("triton", dict(BLOCK_K=64, KEYS_PER_PROG=kpp, num_warps=warps,
                                                                       num_stages=stages, TMA=False))
    return out


pool = torch.empty(128 * 4096 // PAGE + 64 + 131072 // PAGE * 2, PAGE * 132, dtype=torch.uint8, device="cuda")
pool[:, : PAGE * 128] = torch.randn(pool.shape[0], PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
pool[:, PAGE * 128:] = (torch.rand(pool.shape[0], PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    res = dict(batch=batch, ctx=ctx)
    for next_n in (1, 2, 4):
        q, w, table, lens = case(batch, ctx, next_n, pool)
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]

        def default():
            return indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False)

        want = default()
        res[f"nn{next_n} default"] = dict(ms=round(graph_ms(default), 5),
                                          cfg=indexer_gluon.gluon_config(batch, ctx, next_n, 132))
        if next_n == 1:
            continue
        for name, (kind, cfg) in variants(next_n).items():
            if kind == "gluon":
                def fn(cfg=cfg):
                    return indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, next_n, False, cfg)
            else:
                def fn(cfg=cfg):
                    return indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n,
                                                               clean_logits=False, config=cfg)
            try:
                got = fn()
                same = bool(torch.equal(got[inside], want[inside]))
                res[f"nn{next_n} {name}"] = dict(ms=round(graph_ms(fn), 5), same=same)
            except Exception as exc:  # noqa: BLE001
                res[f"nn{next_n} {name}"] = dict(error=str(exc)[:120])
    base = res["nn1 default"]["ms"]
    for k, v in res.items():
        if isinstance(v, dict) and "ms" in v and not k.startswith("nn1"):
            v["cost"] = round(v["ms"] / base, 3)
    best = {n: min(((k, v) for k, v in res.items() if k.startswith(f"nn{n}") and isinstance(v, dict) and "cost" in v),
                   key=lambda kv: kv[1]["cost"]) for n in (2, 4)}
    print(json.dumps(dict(batch=batch, ctx=ctx, nn1=base, default2=res["nn2 default"]["cost"],
                          best2=(best[2][0], best[2][1]["cost"]), default4=res["nn4 default"]["cost"],
                          best4=(best[4][0], best[4][1]["cost"], best[4][1].get("same")))), flush=True)
    rows.append(res)
with open(os.path.join(os.environ.get("OUT", "."), "small_grids.json"), "w") as f:
    json.dump(rows, f, indent=1)

"""Balanced grid timing: the whole call, its kernel alone, its kernel at a program a unit (pure per-tile
rate, no partials), the split grid as mla_config picks it, the unsplit grid, FlashMLA. FP8 pool, top-k 2048."""
import json, sys
import torch
sys.path.insert(0, "benchmarks")
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla
from dsa_kernels import sparse_mla_gluon as G
from dsa_kernels.device import num_sms

SLOTS, TOPK, SCALE = 262144, 2048, 576 ** -0.5
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"), torch.arange(SLOTS, device="cuda"))
views = (pool.view(torch.float8_e4m3fn), pool.view(torch.float32), pool.view(torch.bfloat16))
shapes = [(64, 100), (128, 34), (128, 48), (128, 66), (128, 70), (128, 100), (128, 128)]
split_only = "--split-only" in sys.argv
args = [a for a in sys.argv[1:] if not a.startswith("--")]
for heads, batch in (tuple(map(int, a.split(":"))) for a in args) if args else shapes:
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, TOPK), device="cuda").int()
    cfg = sparse_mla.mla_config(batch, heads, TOPK)
    units, tiles = batch * heads // 64, TOPK // 64
    P = min(num_sms(q.device), units * tiles)
    part = torch.empty(2 * 64 * max(P, units), 512, device="cuda")
    part_lse = torch.empty(2 * 64 * max(P, units), device="cuda")
    out = torch.empty(batch, heads, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(batch, heads, device="cuda")
    kern = lambda programs: G.launch_balanced(q, views, 656, SLOTS, idx, TOPK, part, part_lse, out, lse, SCALE * 1.4426950408889634, True, programs)
    fns = dict(split=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(cfg, BALANCED=False), gluon=True),
               unsplit=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(cfg, SPLIT=1, BALANCED=False), gluon=True),
               bal=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(cfg, BALANCED=True), gluon=True),
               bal_kernel=lambda: kern(P),
               flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
    pieces = sparse_mla.balanced_pieces(units, tiles, P) if not split_only else 0
    if not split_only:
        fns["merge"] = lambda: sparse_mla._merge_balanced_kernel[(P, 64)](part, part_lse, out, lse, tiles, units * tiles, H=heads,
            PIECES=sparse_mla.next_power_of_2(pieces), num_warps=sparse_mla.merge_warps(pieces))
    if units <= num_sms(q.device) and not split_only:
        fns["bal_units"] = lambda: kern(units)
    if split_only:
        fns = {k: fns[k] for k in ("split", "unsplit", "flashmla")}
    r, t = dict(heads=heads, batch=batch, SPLIT=cfg["SPLIT"], programs=P), {}
    for i in range(3):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            t.setdefault(name, []).append(round(graph_ms(fns[name]) * 1e3, 1))
    best = {k: min(v) for k, v in t.items()}
    r["best"] = best
    r["bal_vs_split"] = round(best["split"] / best["bal"], 3) if "bal" in best else None
    r["bal_vs_flash"] = round(best["flashmla"] / best["bal"], 3) if "bal" in best else None
    print(json.dumps({k: r[k] for k in ("heads", "batch", "SPLIT", "programs", "best", "bal_vs_split", "bal_vs_flash")}), flush=True)

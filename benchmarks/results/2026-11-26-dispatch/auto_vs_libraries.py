"""Ours against the libraries at the call shapes where dispatch's "auto" rules choose between them
(_ours_instead_of_deepgemm, _ours_instead_of_flashmla): CUDA graphs, alternating replays, best of
three, and what "auto" now picks. Paged indexer logits (64 heads, page 64, keys in L2 as the
official table, clean_logits=False as the engine calls it) against DeepGEMM; sparse MLA decode
(FP8 pool, top-k 2048, 262144 slots) against FlashMLA. Writes $OUT/auto_vs_libraries.json."""
import json, math, os, sys, time

sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, indexer_logits, sparse_mla

DEV, PAGE, ROUNDS = "cuda", 64, 3
torch.manual_seed(0)
rows = []


def best_of(fns):
    times = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            times[name].append(round(graph_ms(fn) * 1e3, 2))
    return {name: min(t) for name, t in times.items()}, times


# ---- paged indexer logits
pool = torch.empty(128 * 131072 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device=DEV)
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device=DEV).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device=DEV) * 0.02 + 0.01).view(torch.uint8)
for ctx in (4096, 32768, 131072):
    for batch in (1, 8, 32, 64, 128):
        for next_n in (1, 2):
            pages = math.ceil(ctx / PAGE)
            table = torch.randperm(pool.shape[0], device=DEV)[: batch * pages].view(batch, pages).int()
            seq = torch.full((batch,), ctx, device=DEV)
            lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
            q = torch.randn(batch * next_n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
            w = torch.randn(batch * next_n, 64, device=DEV) * 0.1
            fns = dict(ours=lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n,
                                                                       clean_logits=False),
                       deepgemm=lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, False))
            best, times = best_of(fns)
            auto = "ours" if dispatch._ours_instead_of_deepgemm(q, ctx, next_n, PAGE) else "deepgemm"
            r = dict(op="paged indexer", batch=batch, ctx=ctx, next_n=next_n, us=best, all=times, auto=auto,
                     ours_speed_over_deepgemm=round(best["deepgemm"] / best["ours"], 3),
                     auto_speed_over_before=round(best["deepgemm"] / best[auto], 3))
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "all"}), flush=True)
del pool

# ---- sparse MLA decode, FP8 pool
SCALE, SLOTS = 576 ** -0.5, 262144
kv = torch.zeros(SLOTS, 656, dtype=torch.uint8, device=DEV)
dispatch.store_mla_kv(kv, torch.randn(SLOTS, 512, device=DEV), torch.randn(SLOTS, 64, device=DEV),
                      torch.arange(SLOTS, device=DEV))
for heads, batches in ((128, (1, 2, 4, 8, 12, 16, 17, 20, 24, 32)), (64, (1, 4, 8, 16, 24, 32, 33, 34, 40))):
    for n in batches:
        q = torch.randn(n, heads, 576, device=DEV).to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (n, 2048), device=DEV).int()
        fns = dict(ours=lambda: sparse_mla.sparse_mla(q, kv, idx, SCALE),
                   flashmla=lambda: dispatch._flashmla_decode(q, kv, idx, SCALE))
        (o1, l1), (o2, l2) = fns["ours"](), fns["flashmla"]()
        best, times = best_of(fns)
        auto = "ours" if dispatch._ours_instead_of_flashmla(q, kv) else "flashmla"
        r = dict(op="sparse MLA decode", heads=heads, batch=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
                 us=best, all=times, auto=auto, ours_speed_over_flashmla=round(best["flashmla"] / best["ours"], 3),
                 auto_speed_over_before=round(best["flashmla"] / best[auto], 3),
                 rel_diff=round(float((o1.float() - o2.float()).norm() / o2.float().norm()), 5))
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "all"}), flush=True)

json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "auto_vs_libraries.json"), "w"), indent=1)

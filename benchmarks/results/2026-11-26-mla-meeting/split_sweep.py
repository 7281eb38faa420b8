"""Sparse MLA decode (FP8 pool, top-k 2048) at the batches past the split's end: every split count
1-8 on the Gluon kernel (explicit SPLIT; the merge kernel merges where the splits cannot meet),
CUDA graphs, best of two, FlashMLA beside. Writes $OUT/$AB_NAME."""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla

SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for heads, batches in ((128, (20, 24, 34, 40, 48, 56, 64, 67, 80, 96, 128)), (64, (40, 67, 80, 100))):
    for n in batches:
        q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
        r = dict(heads=heads, n=n, default_split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"])
        fm = lambda: dispatch._flashmla_decode(q, pool, idx, SCALE)
        r["flashmla"] = min(round(graph_ms(fm) * 1e3, 2) for _ in range(2))
        for s in (1, 2, 3, 4, 5, 6, 8):
            cfg = dict(sparse_mla.mla_config(n, heads, 2048), SPLIT=s)
            fn = lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=cfg, gluon=True)
            r[f"split{s}"] = min(round(graph_ms(fn) * 1e3, 2) for _ in range(2))
        best = min((r[f"split{s}"], s) for s in (1, 2, 3, 4, 5, 6, 8))
        r["best_split"], r["best_vs_fm"] = best[1], round(r["flashmla"] / best[0], 3)
        r["default_vs_fm"] = round(r["flashmla"] / r[f"split{r['default_split']}"], 3)
        rows.append(r)
        print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("AB_NAME", "split_sweep.json")), "w"), indent=1)

"""Sparse MLA decode (FP8 pool, top-k 2048) across the batches where mla_config stops splitting:
ours (default path) and FlashMLA, CUDA graphs (benchmarks/graph_timing.py), best of three.
Writes $OUT/$AB_NAME."""
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
for heads, batches in ((128, (16, 24, 32, 33, 34, 40, 48, 56, 64, 66, 67, 96)), (64, (64, 66, 67, 80, 100, 128))):
    for n in batches:
        q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
        fns = dict(ours=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE),
                   flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
        r = dict(heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"])
        for _ in range(3):
            for name, fn in fns.items():
                r.setdefault(name, []).append(round(graph_ms(fn) * 1e3, 2))
        r["ours_vs_fm"] = round(min(r["flashmla"]) / min(r["ours"]), 3)
        rows.append(r)
        print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("AB_NAME", "batch_cliff.json")), "w"), indent=1)

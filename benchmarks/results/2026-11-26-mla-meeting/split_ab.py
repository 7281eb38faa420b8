"""The split model (sparse_mla.mla_config, the working tree) against the one-wave power-of-two
split (the kernels of the commit before, with the meeting, copied to .ab/oldk2/dsa_kernels_old):
default paths, FP8 pool, top-k 2048, alternating CUDA-graph timings, best of three, FlashMLA
beside. Writes $OUT/$AB_NAME."""
import json, os, sys, time
sys.path.insert(0, ".ab/oldk2")
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla
from dsa_kernels_old import sparse_mla as old_mla

SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for heads, batches in ((128, (17, 20, 34, 40, 44, 67, 72, 80, 96, 140, 32, 48, 128)), (64, (40, 67, 80, 140))):
    for n in batches:
        q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
        fns = dict(new=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE),
                   old=lambda: old_mla.sparse_mla(q, pool, idx, SCALE),
                   flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
        (o1, _), (o0, _) = fns["new"](), fns["old"]()
        r = dict(heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
                 old_split=old_mla.mla_config(n, heads, 2048)["SPLIT"],
                 out_maxdiff=float((o1.float() - o0.float()).abs().max()))
        for _ in range(3):
            for name, fn in fns.items():
                r.setdefault(name, []).append(round(graph_ms(fn) * 1e3, 2))
        r["new_vs_old"] = round(min(r["old"]) / min(r["new"]), 3)
        r["new_vs_fm"] = round(min(r["flashmla"]) / min(r["new"]), 3)
        r["old_vs_fm"] = round(min(r["flashmla"]) / min(r["old"]), 3)
        rows.append(r)
        print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("AB_NAME", "split_ab.json")), "w"), indent=1)

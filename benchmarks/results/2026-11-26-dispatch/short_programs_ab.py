"""The half-wave rule for short programs (sparse_mla.SHORT_PROGRAM_TILES, the working tree)
against the split before it (the kernels of the commit before, copied to
.ab/oldk3/dsa_kernels_old): default paths, FP8 pool, top-k 2048, alternating CUDA-graph
replays, best of three, FlashMLA beside. Writes $OUT/short_programs_ab.json."""
import json, os, sys, time

sys.path.insert(0, ".ab/oldk3")
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
for heads, batches in ((128, (2, 3, 4, 1, 12)), (64, (3, 4, 5, 6, 7, 8, 2))):
    for n in batches:
        q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
        fns = dict(new=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE),
                   old=lambda: old_mla.sparse_mla(q, pool, idx, SCALE),
                   flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
        (o1, _), (o0, _) = fns["new"](), fns["old"]()
        want, _ = dispatch.ref.sparse_mla_ref(q, pool, idx, SCALE)
        r = dict(heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
                 old_split=old_mla.mla_config(n, heads, 2048)["SPLIT"],
                 rel_err_new=round(float((o1.float() - want).norm() / want.norm()), 5),
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
          open(os.path.join(os.environ.get("OUT", "/tmp"), "short_programs_ab.json"), "w"), indent=1)

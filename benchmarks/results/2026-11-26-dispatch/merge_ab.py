"""Whole-row merges and the one-tile rule (the working tree) against the session's call-3 kernels
(SHORT_PROGRAM_TILES 4, 128-column merges: .ab/oldk4/dsa_kernels_old) and the session's start
(.ab/oldk3/dsa_kernels_old): default paths, FP8 pool, top-k 2048, alternating CUDA-graph replays,
best of three, FlashMLA beside. Writes $OUT/merge_ab.json."""
import importlib, json, os, sys, time

sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla


def old(path):
    sys.path.insert(0, path)
    for name in [m for m in sys.modules if m.startswith("dsa_kernels_old")]:
        del sys.modules[name]
    module = importlib.import_module("dsa_kernels_old.sparse_mla")
    sys.path.remove(path)
    return module


mid, start = old(".ab/oldk4"), old(".ab/oldk3")
SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for heads, batches in ((128, (1, 2, 3, 4, 6, 8, 12, 16)), (64, (1, 2, 3, 4, 5, 6, 8, 12, 16))):
    for n in batches:
        q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
        fns = dict(new=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE),
                   mid=lambda: mid.sparse_mla(q, pool, idx, SCALE),
                   start=lambda: start.sparse_mla(q, pool, idx, SCALE),
                   flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
        o1, o0 = fns["new"]()[0], fns["start"]()[0]
        want, _ = dispatch.ref.sparse_mla_ref(q, pool, idx, SCALE)
        r = dict(heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
                 mid_split=mid.mla_config(n, heads, 2048)["SPLIT"], start_split=start.mla_config(n, heads, 2048)["SPLIT"],
                 rel_err_new=round(float((o1.float() - want).norm() / want.norm()), 5),
                 maxdiff_vs_start=float((o1.float() - o0.float()).abs().max()))
        for _ in range(3):
            for name, fn in fns.items():
                r.setdefault(name, []).append(round(graph_ms(fn) * 1e3, 2))
        best = {k: min(r[k]) for k in fns}
        r.update(new_vs_start=round(best["start"] / best["new"], 3), new_vs_mid=round(best["mid"] / best["new"], 3),
                 new_vs_fm=round(best["flashmla"] / best["new"], 3), start_vs_fm=round(best["flashmla"] / best["start"], 3))
        rows.append(r)
        print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "merge_ab.json"), "w"), indent=1)

"""Sparse MLA decode at 1-16 rows: our Gluon kernel at every power-of-two split (mla_config's
64-key tiles, SPLIT forced) and at its default split, against FlashMLA; FP8 pool, top-k 2048,
CUDA graphs, alternating replays, best of three. The split model (sparse_mla._split_time) was
fitted at 20-128 rows; this is where it extrapolates. Writes $OUT/small_batch_splits.json."""
import json, os, sys, time

sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla

DEV, SCALE, SLOTS = "cuda", 576 ** -0.5, 262144
torch.manual_seed(0)
kv = torch.zeros(SLOTS, 656, dtype=torch.uint8, device=DEV)
dispatch.store_mla_kv(kv, torch.randn(SLOTS, 512, device=DEV), torch.randn(SLOTS, 64, device=DEV),
                      torch.arange(SLOTS, device=DEV))
rows = []
for heads, batches in ((128, (1, 2, 3, 4, 6, 8, 12, 16)), (64, (1, 2, 4, 8, 12, 16))):
    for n in batches:
        q = torch.randn(n, heads, 576, device=DEV).to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (n, 2048), device=DEV).int()
        base = sparse_mla.mla_config(n, heads, 2048)
        fns = dict(default=lambda: sparse_mla.sparse_mla(q, kv, idx, SCALE),
                   flashmla=lambda: dispatch._flashmla_decode(q, kv, idx, SCALE))
        for split in (1, 2, 4, 8, 16, 32):
            if n * heads // 64 * split <= 2 * 132:
                fns[f"split{split}"] = (lambda s: lambda: sparse_mla.sparse_mla(
                    q, kv, idx, SCALE, config=dict(base, SPLIT=s), gluon=True))(split)
        times = {k: [] for k in fns}
        for _ in range(3):
            for k, fn in fns.items():
                times[k].append(round(graph_ms(fn) * 1e3, 2))
        best = {k: min(v) for k, v in times.items()}
        splits = {k: v for k, v in best.items() if k.startswith("split")}
        fastest = min(splits, key=splits.get)
        r = dict(heads=heads, n=n, default_split=base["SPLIT"], us=best, fastest=fastest,
                 default_vs_fm=round(best["flashmla"] / best["default"], 3),
                 fastest_vs_fm=round(best["flashmla"] / best[fastest], 3),
                 model={s: round(sparse_mla._split_time(n * heads // 64, 32, s, 132), 1) for s in (1, 2, 4, 8, 16, 32)})
        rows.append(r)
        print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "small_batch_splits.json"), "w"), indent=1)

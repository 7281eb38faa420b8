"""Is it the logits' L2 state after the indexer that makes the top-k slower behind it than alone?
Ran on 5b39dc4; on the device, from the repository root (the dsa_kernels link as in
benchmarks/device_checks.sh): source .device/setup.sh && python3 benchmarks/results/2026-11-25-topk-after-indexer/gap2.py"""
import json, os, sys
import torch
import triton.testing
sys.path.insert(0, "benchmarks")
import topk_ab as ab
from dsa_kernels import indexer_gluon, indexer_logits, topk, topk_cooperative as tc

OUT = os.environ.get("OUT", ".")
g = lambda fn: 1000 * float(triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median"))
src = torch.empty(1 << 25, device="cuda"); dst = torch.empty_like(src)
flush = lambda: dst.copy_(src)
res = []
evict = indexer_gluon._logits_eviction
for n, w in [(32, 32768), (8, 131072), (16, 32768)]:
    case, lens, table = ab.indexer_case(n, w, indexer_gluon)
    logits = case()
    buf2 = torch.empty_like(logits)
    parts = tc.parts_per_row(n, w, ab.SMS)
    out = torch.empty(n, ab.K, device="cuda", dtype=torch.int32)
    def top(x):
        assert tc.cooperative_topk(x, lens, None, ab.K, parts, out, topk.TRANSFORM_PAGED, table, ab.PAGE, 1, None)
        return out
    r = dict(shape=[n, w])
    for rnd in range(2):
        r["alone"] = g(lambda: top(logits))
        i = g(case); r["indexer"] = i
        r["A_behind_indexer"] = g(lambda: top(case())) - i
        indexer_gluon._logits_eviction = lambda out: ""
        i2 = g(case); r["indexer_normal_stores"] = i2
        r["B_behind_indexer_normal_stores"] = g(lambda: top(case())) - i2
        indexer_gluon._logits_eviction = evict
        c = g(lambda: buf2.copy_(case())); r["indexer_copy"] = c
        r["C_behind_indexer_copy"] = g(lambda: top(buf2.copy_(case()))) - c
        t = g(lambda: case().sum()); r["indexer_touch"] = t
        r["D_behind_indexer_touch"] = g(lambda: (lambda x: (x.sum(), top(x)))(case())) - t
        f = g(lambda: (flush(), case())); r["flush_indexer"] = f
        r["E_behind_flush_indexer"] = g(lambda: top((flush(), case())[1])) - f
        rr = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
        rr["round"] = rnd
        res.append(rr); print(json.dumps(rr), flush=True)
        json.dump(res, open(os.path.join(OUT, "gap2.json"), "w"), indent=1)

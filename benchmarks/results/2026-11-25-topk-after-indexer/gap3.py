"""The top-k behind the indexer's evict_last logits: its slice read evict_first (kept), plain, or
evict_last; and behind normal stores. Ran on 5b39dc4. Setup, from the repository root:
    mkdir -p .ab && D=benchmarks/results/2026-11-25-topk-after-indexer
    patch -o .ab/noef.py kernels/topk_cooperative.py $D/slice-read-plain.diff
    patch -o .ab/el.py kernels/topk_cooperative.py $D/slice-read-evict-last.diff
then on the device (carrying .device and .ab; the dsa_kernels link as in benchmarks/device_checks.sh):
    source .device/setup.sh && python3 $D/gap3.py   (writes $OUT/gap3.json)"""
import json, os, sys
import torch
import triton.testing
sys.path.insert(0, "benchmarks")
import topk_ab as ab
from dsa_kernels import indexer_gluon, topk, topk_cooperative as tc

OUT = os.environ.get("OUT", ".")
g = lambda fn: 1000 * float(triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median"))
variants = {"kept": tc, "plain": ab.load_variant("plain", ".ab/noef.py"), "evict_last": ab.load_variant("el", ".ab/el.py")}
evict = indexer_gluon._logits_eviction
res = []
for n, w in [(32, 32768), (8, 131072), (16, 32768)]:
    case, lens, table = ab.indexer_case(n, w, indexer_gluon)
    logits = case()
    want = ab.expected(logits, lens, table)
    for rnd in range(2):
        for name, mod in (variants.items() if rnd == 0 else reversed(list(variants.items()))):
            run = ab.runner(mod, n, w)
            exact = torch.equal(ab.runner(mod, n, w, poison=True)(logits, lens, table), want)
            r = dict(shape=[n, w], kernel=name, round=rnd, exact=exact)
            r["alone"] = g(lambda: run(logits, lens, table))
            i = g(case); r["indexer"] = i
            r["behind"] = g(lambda: run(case(), lens, table)) - i
            indexer_gluon._logits_eviction = lambda out: ""
            i2 = g(case); r["indexer_normal"] = i2
            r["behind_normal"] = g(lambda: run(case(), lens, table)) - i2
            indexer_gluon._logits_eviction = evict
            r = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
            res.append(r); print(json.dumps(r), flush=True)
            json.dump(res, open(os.path.join(OUT, "gap3.json"), "w"), indent=1)

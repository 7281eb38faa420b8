"""Split sparse MLA decode: splits that meet and merge in the Gluon kernel (the working tree)
against the committed kernels (a separate merge launch, copied to .ab/oldk/dsa_kernels_old):
outputs compared, then alternating CUDA-graph timings (benchmarks/graph_timing.py, warmed up on
the capture stream) with FlashMLA in the same call. Writes $OUT/$AB_NAME."""
import json, os, sys, time
sys.path.insert(0, ".ab/oldk")
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla
from dsa_kernels_old import sparse_mla as old_mla

SCALE, SLOTS = 576 ** -0.5, 262144
ROUNDS = int(os.environ.get("ROUNDS", "3"))
torch.manual_seed(0)
pools = {}
for fp8 in (True, False):
    pool = torch.zeros(SLOTS, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
    dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                          torch.arange(SLOTS, device="cuda"))
    pools[fp8] = pool
shapes = [(128, 32, True), (128, 16, True), (128, 4, True), (128, 1, True), (64, 32, True), (64, 16, True),
          (64, 1, True), (128, 64, True), (128, 32, False), (64, 32, False)]
rows = []
for heads, n, fp8 in shapes:
    pool = pools[fp8]
    q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    new = lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE)
    old = lambda: old_mla.sparse_mla(q, pool, idx, SCALE)
    (o1, l1), (o0, l0) = new(), old()
    r = dict(heads=heads, n=n, fp8=fp8, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
             out_maxdiff=float((o1.float() - o0.float()).abs().max()), out_equal=bool(torch.equal(o1, o0)),
             lse_maxdiff=float((l1 - l0).abs().max()))
    fns = dict(new=new, old=old)
    if fp8:
        fns["flashmla"] = lambda: dispatch._flashmla_decode(q, pool, idx, SCALE)
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            r.setdefault(name, []).append(round(graph_ms(fn) * 1e3, 2))
    r["new_vs_old"] = round(min(r["old"]) / min(r["new"]), 3)
    if fp8:
        r["new_vs_fm"] = round(min(r["flashmla"]) / min(r["new"]), 3)
        r["old_vs_fm"] = round(min(r["flashmla"]) / min(r["old"]), 3)
    rows.append(r)
    print(json.dumps(r), flush=True)
    json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
              open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("AB_NAME", "meet_ab.json")), "w"), indent=1)

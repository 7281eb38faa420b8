"""The FP8 dequantization split between the gatherer and the second warpgroup (working tree) against
HEAD's kernel (.ab/base/dsa_kernels_old): exactness (bit for bit against HEAD's, error against the
reference) and alternating CUDA-graph replays, best of three, FlashMLA beside. $OUT/split_deq_ab.json."""
import importlib, json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla

sys.path.insert(0, ".ab/base")
base = importlib.import_module("dsa_kernels_old.sparse_mla")
SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pools = {}
pools["fp8"] = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
lat, rope = torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda")
dispatch.store_mla_kv(pools["fp8"], lat, rope, torch.arange(SLOTS, device="cuda"))
pools["bf16"] = torch.cat([lat, rope], 1).to(torch.bfloat16)
rows = []
for pool_name, heads, n in [("fp8", 128, b) for b in (128, 64, 100, 32, 16, 4, 2, 1)] + \
        [("fp8", 64, b) for b in (128, 32, 1)] + [("bf16", 128, 128), ("bf16", 128, 32)]:
    pool = pools[pool_name]
    q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    idx[0, 1500:] = -1  # a short row
    fns = dict(new=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE), base=lambda: base.sparse_mla(q, pool, idx, SCALE))
    if pool_name == "fp8":
        fns["flashmla"] = lambda: dispatch._flashmla_decode(q, pool, idx, SCALE)
    o_new, lse_new = fns["new"]()
    o_base, lse_base = fns["base"]()
    want, _ = dispatch.ref.sparse_mla_ref(q, pool, idx, SCALE)
    r = dict(pool=pool_name, heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
             equal_to_base=bool(torch.equal(o_new, o_base) and torch.equal(lse_new, lse_base)),
             rel_err=round(float((o_new.float() - want).norm() / want.norm()), 5))
    for i in range(3):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            r.setdefault(name, []).append(round(graph_ms(fns[name]) * 1e3, 2))
    b = {k: min(r[k]) for k in fns}
    r["speedup"] = round(b["base"] / b["new"], 3)
    if "flashmla" in b:
        r.update(new_vs_fm=round(b["flashmla"] / b["new"], 3), base_vs_fm=round(b["flashmla"] / b["base"], 3))
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "split_deq_ab.json"), "w"), indent=1)

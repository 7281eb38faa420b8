"""Bound: FP8 sparse MLA decode at 128 heads with each head block's CTA copying and dequantizing only
half of every tile's latent rows (wrong output: timing only), against the committed kernel and
FlashMLA. Alternating CUDA-graph replays, best of three. Writes $OUT/half_ab.json."""
import importlib, json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla

sys.path.insert(0, ".ab/halfk")
half = importlib.import_module("dsa_kernels_old.sparse_mla")
SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for heads, n in ((128, 128), (128, 64), (128, 32), (128, 100)):
    q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    fns = dict(committed=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE),
               half_gather=lambda: half.sparse_mla(q, pool, idx, SCALE),
               flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
    want, _ = dispatch.ref.sparse_mla_ref(q, pool, idx, SCALE)
    o = fns["committed"]()[0]
    r = dict(heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
             rel_err_committed=round(float((o.float() - want).norm() / want.norm()), 5))
    for i in range(3):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            r.setdefault(name, []).append(round(graph_ms(fns[name]) * 1e3, 2))
    b = {k: min(r[k]) for k in fns}
    r.update(committed_vs_fm=round(b["flashmla"] / b["committed"], 3), half_vs_fm=round(b["flashmla"] / b["half_gather"], 3),
             half_speedup=round(b["committed"] / b["half_gather"], 3))
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "half_ab.json"), "w"), indent=1)

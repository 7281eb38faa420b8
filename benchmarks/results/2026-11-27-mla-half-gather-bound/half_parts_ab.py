"""Which half of the gatherer's work bounds 128 heads: half the raw copies only, half the
dequantization only, both (the half-gather bound), against the committed kernel and FlashMLA.
Wrong outputs except the committed kernel's; timing only. Alternating CUDA-graph replays, best of three."""
import importlib, json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla

mods = {}
for name, path, pkg in (("half_both", ".ab/halfk", "dsa_kernels_old"), ("half_copy", ".ab/half_copy", "dsa_kernels_hc"),
                        ("half_dequant", ".ab/half_deq", "dsa_kernels_hd")):
    sys.path.insert(0, path)
    mods[name] = importlib.import_module(f"{pkg}.sparse_mla")
SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for n in (128, 64):
    q = torch.randn(n, 128, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    fns = dict(committed=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE))
    for name, m in mods.items():
        fns[name] = (lambda m=m: m.sparse_mla(q, pool, idx, SCALE))
    fns["flashmla"] = lambda: dispatch._flashmla_decode(q, pool, idx, SCALE)
    r = dict(heads=128, n=n)
    for i in range(3):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            r.setdefault(name, []).append(round(graph_ms(fns[name]) * 1e3, 2))
    best = {k: min(r[k]) for k in fns}
    r.update({f"{k}_speedup": round(best["committed"] / best[k], 3) for k in fns if k != "committed"})
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "half_parts_ab.json"), "w"), indent=1)

"""Sparse MLA decode (ours, FP8 pool, top-k 2048): the committed kernels of 0cf19cc (a copy in
.ab/s46/oldk) against num_splits unspecialized; CUDA graphs, alternating rounds, µs; outputs bit for bit."""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".ab/s46")
from graph_timing import alternating_us  # noqa: E402

import dsa_kernels  # noqa: E402
import oldk  # noqa: E402
from dsa_kernels import cache_store, sparse_mla  # noqa: E402

torch.manual_seed(0)
SLOTS = 262144
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
cache_store.store_mla(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
res = {"gpu": torch.cuda.get_device_name(), "rows": []}
for heads, batch in [(64, 1), (128, 1), (64, 4), (64, 32), (128, 32), (64, 128), (128, 128)]:
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    cfg = sparse_mla.mla_config(batch, heads, 2048)
    fns = {tag: (lambda m=m: m.sparse_mla_decode(q, pool, idx, 576**-0.5, backend="ours"))
           for tag, m in (("old", oldk), ("new", dsa_kernels))}
    a, b = fns["old"](), fns["new"]()
    same = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
    times = alternating_us(fns, rounds=3)
    row = dict(heads=heads, batch=batch, split=cfg["SPLIT"], balanced=cfg.get("BALANCED", False), same=same,
               best_us={k: min(v) for k, v in times.items()}, times_us=times)
    print(json.dumps(row), flush=True)
    res["rows"].append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)

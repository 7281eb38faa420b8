"""A/B: next_n 4 on large grids (programs that wait for each MMA, more than four an SM), with the
second token pair's weights held in registers for the whole program (the committed kernel) or
loaded when each tile's second unit is scored (W1_LAZY in .ab/indexer_w1.py: 128 registers
instead of 160 on the CPU's sm_90 build, so four programs fit an SM instead of three).
CUDA-graph medians, alternating, best of three; logits compared bit for bit."""

import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

spec = importlib.util.spec_from_file_location("dsa_kernels.variant", ".ab/indexer_w1.py")  # with lazy-w1.patch
variant = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variant)

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = [(32, 32768), (64, 32768), (128, 32768), (32, 131072), (64, 131072), (128, 131072), (128, 8192), (256, 4096)]
pool = torch.empty(128 * 131072 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    seq = torch.full((batch,), ctx, device="cuda")
    for next_n in (1, 4):
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        cfg = indexer_gluon.gluon_config(batch, ctx, next_n, SMS)
        fns = {"committed": lambda: indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, next_n,
                                                                       False, cfg)}
        if next_n == 4:
            fns["lazy w1"] = lambda: variant.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, next_n, False,
                                                                  dict(cfg, W1_LAZY=True))
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
        want = fns["committed"]()
        same = {k: bool(torch.equal(f()[inside], want[inside])) for k, f in fns.items()}
        times = {k: [] for k in fns}
        for _ in range(3):
            for k, f in fns.items():
                times[k].append(graph_ms(f))
        us = {k: round(min(v) * 1000, 2) for k, v in times.items()}
        if next_n == 1:
            base = us["committed"]
            continue
        row = dict(batch=batch, ctx=ctx, next_n=next_n, cfg=cfg, us=us, next_n_1_us=base, same=same,
                   cost={k: round(v / base, 3) for k, v in us.items()},
                   speedup=round(us["committed"] / us["lazy w1"], 3))
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "lazy_w1_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)
for name, fn in (("committed", indexer_gluon._paged_logits_kernel), ("variant", variant._paged_logits_kernel)):
    try:  # registers of each compiled specialization
        for cache in fn.device_caches.values():
            for k in cache[0].values():
                print(name, "regs", k.n_regs, "spills", k.n_spills, flush=True)
    except Exception as exc:  # noqa: BLE001
        print(name, "no register report:", exc)

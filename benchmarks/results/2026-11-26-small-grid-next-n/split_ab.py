"""next_n 2 / 4 with eight warps, two warpgroups side by side along the MMA's N (each scores its
own tokens), against the rule's four warps, at its chunk and half of it, both schedules. The
variant kernel is .ab/indexer_split.py (kernels/indexer_gluon.py with `warps_per_cta=[4, SPLIT]`
and the launch's num_warps from the config's WARPS). CUDA-graph medians, alternating, best of two;
logits compared bit for bit with the default path inside each row's length."""

import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

spec = importlib.util.spec_from_file_location("dsa_kernels.indexer_split", ".ab/indexer_split.py")
split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(split)
PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = [(32, 4096), (1, 131072), (1, 32768), (1, 4096), (2, 32768), (8, 8192), (16, 8192), (8, 32768),
          (128, 4096), (32, 32768)]
pool = torch.empty(128 * 4096 // PAGE + 64 + 131072 // PAGE, PAGE * 132, dtype=torch.uint8, device="cuda")
pool[:, : PAGE * 128] = torch.randn(pool.shape[0], PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
pool[:, PAGE * 128:] = (torch.rand(pool.shape[0], PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    for next_n in (1, 2, 4):
        cfg = indexer_gluon.gluon_config(batch, ctx, next_n, SMS)
        table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
        seq = torch.full((batch,), ctx, device="cuda")
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
        kpp = cfg["KEYS_PER_PROG"]
        variants = {"rule": (indexer_gluon, cfg)}
        if next_n > 1:
            for k in {kpp, max(64, kpp // 2)}:
                variants[f"8w overlap {k}"] = (split, dict(cfg, KEYS_PER_PROG=k, STAGES=4, OVERLAP=True,
                                                           UNROLLED=False, WARPS=8))
                variants[f"8w one-mma {k}"] = (split, dict(cfg, KEYS_PER_PROG=k, STAGES=2, OVERLAP=False,
                                                           UNROLLED=False, WARPS=8))
        fns = {name: (lambda m=m, c=c: m.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, next_n, False, c))
               for name, (m, c) in variants.items()}
        want = fns["rule"]()
        same = {}
        for name, f in fns.items():
            try:
                same[name] = bool(torch.equal(f()[inside], want[inside]))
            except Exception as exc:  # noqa: BLE001
                same[name] = str(exc)[:100]
        times = {k: [] for k in fns if same[k] is True}
        for _ in range(2):
            for k in times:
                times[k].append(graph_ms(fns[k]))
        best = {k: round(min(v) * 1e3, 2) for k, v in times.items()}
        row = dict(batch=batch, ctx=ctx, next_n=next_n, kpp=kpp, us=best,
                   failed={k: v for k, v in same.items() if v is not True})
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "split_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)

"""A/B of the paged indexer's default path before and after small grids took the Gluon kernel
with short key chunks (gluon_config), at every shape where the two choose differently and at
bench_kernels' shapes, next_n 1 / 2 / 4. 'before' is the committed rule (copied below): the
Triton kernel where it returned None. CUDA-graph medians, alternating, best of two per side;
logits compared bit for bit inside each row's length. Also next_n 1 with 64-key programs where the
new rule takes 128."""

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_gluon, indexer_logits  # noqa: E402

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count


def before(batch, ctx, next_n, num_sms):
    """gluon_config as committed at b6978ea."""
    def programs(kpp):
        return batch * triton.cdiv(ctx, kpp)

    if next_n == 1:
        kpp = next((k for k in (1024, 2048) if programs(k) <= 4 * num_sms), 1024)
        return dict(KEYS_PER_PROG=kpp, STAGES=4, OVERLAP=True, UNROLLED=False) if programs(kpp) >= 256 else None
    kpp = next((k for k in (2048, 1024, 512) if k <= (2048 if next_n == 2 else 1024) and programs(k) >= num_sms),
               None)
    if kpp is None:
        return None
    if programs(kpp) > 4 * num_sms:
        return dict(KEYS_PER_PROG=kpp, STAGES=2, OVERLAP=False, UNROLLED=next_n == 2)
    return dict(KEYS_PER_PROG=kpp, STAGES=4, OVERLAP=True, UNROLLED=False)


SHAPES = [(b, c) for c in (4096, 32768, 131072) for b in (1, 32, 128)] + \
         [(b, c) for c in (8192, 32768, 131072) for b in (2, 4, 8, 16)] + [(1, 1024), (1, 8192), (64, 4096)]
pool = torch.empty(128 * 131072 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    for next_n in (1, 2, 4):
        old, new = before(batch, ctx, next_n, SMS), indexer_gluon.gluon_config(batch, ctx, next_n, SMS)
        bench_shape = batch in (1, 32, 128) and ctx in (4096, 32768, 131072)
        if old == new and not bench_shape:
            continue
        table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
        seq = torch.full((batch,), ctx, device="cuda")
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]

        def run(cfg):
            if cfg is None:
                return indexer_logits.paged_indexer_logits(
                    q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False,
                    config=indexer_logits.paged_config(batch, ctx, next_n, page_size=PAGE))
            return indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, next_n, False, cfg)

        def default():
            return indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False)

        fns = {"before": lambda: run(old), "after": default}
        if next_n == 1 and new["KEYS_PER_PROG"] == 128:
            fns["64 keys"] = lambda: run(dict(new, KEYS_PER_PROG=64))
        want = fns["before"]()
        same = {k: bool(torch.equal(f()[inside], want[inside])) for k, f in fns.items()}
        times = {k: [] for k in fns}
        for _ in range(2):
            for k, f in fns.items():
                times[k].append(graph_ms(f))
        best = {k: round(min(v), 5) for k, v in times.items()}
        row = dict(batch=batch, ctx=ctx, next_n=next_n, before=old and old["KEYS_PER_PROG"],
                   after=new["KEYS_PER_PROG"], ms=best, same=same,
                   speedup=round(best["before"] / best["after"], 3))
        print(json.dumps(row), flush=True)
        rows.append(row)
with open(os.path.join(os.environ.get("OUT", "."), "chunks_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)

"""Sparse MLA decode on a balanced grid against the split grid, FlashMLA beside, in one device call.

    source .device/setup.sh && python3 benchmarks/bench_mla_balanced.py [--shapes 128:34,70,100;64:140] [--json F]

For each (heads, batch) (top-k 2048 over a 256K-slot FP8 pool, a short and an empty row among them)
it checks the balanced grid's output against the split grid's (relative error, norm over norm), then times
both, as kernels/sparse_mla.py would run them (the split grid with its meetings and CTA pairs), and
FlashMLA's sparse decode, in CUDA graphs, alternating their order, best of three. `chosen` says
which of the two mla_config picks.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dsa_kernels import dispatch, sparse_mla
from graph_timing import alternating_us

SLOTS, TOPK, SCALE = 262144, 2048, 576**-0.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:33,34,40,44,48,66,67,80,90,100,110,115,116,128;64:67,80,88,100,133,180,231")
    ap.add_argument("--json", default="mla_balanced.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
    dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                          torch.arange(SLOTS, device="cuda"))
    rows = []
    for spec in args.shapes.split(";"):
        heads, batches = spec.split(":")
        heads = int(heads)
        for batch in map(int, batches.split(",")):
            q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, SLOTS, (batch, TOPK), device="cuda").int()
            idx[0, 1000:] = -1
            if batch > 1:
                idx[-1] = -1
            config = sparse_mla.mla_config(batch, heads, TOPK)
            fns = dict(
                split=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(config, BALANCED=False), gluon=True),
                balanced=lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(config, BALANCED=True), gluon=True),
                flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
            a, la = fns["split"]()
            b, lb = fns["balanced"]()
            torch.cuda.synchronize()
            finite = torch.isfinite(la)
            r = dict(heads=heads, batch=batch, split=config["SPLIT"], chosen="balanced" if config.get("BALANCED") else "split",
                     rel_err=float((a.float() - b.float()).norm() / a.float().norm()),
                     lse_same=bool(torch.equal(torch.isinf(la), torch.isinf(lb))
                                   and torch.allclose(la[finite], lb[finite], rtol=1e-5, atol=1e-5)))
            times = alternating_us(fns)
            r.update({name + "_us": t for name, t in times.items()})
            best = {name: min(t) for name, t in times.items()}
            r.update(balanced_vs_split=round(best["split"] / best["balanced"], 3),
                     split_vs_flashmla=round(best["flashmla"] / best["split"], 3),
                     balanced_vs_flashmla=round(best["flashmla"] / best["balanced"], 3))
            rows.append(r)
            print(json.dumps(r), flush=True)
            with open(args.json, "w") as f:
                json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

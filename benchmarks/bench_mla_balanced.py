"""Sparse MLA decode on a balanced grid against the split grid, FlashMLA beside, in one device call.

    source .device/setup.sh && python3 benchmarks/bench_mla_balanced.py [--shapes 128:34,70,100;64:140] [--json F]

For each (heads, batch) (top-k 2048 over a 256K-slot FP8 pool, a short and an empty row among them)
it checks the balanced grid's output against the split grid's (relative error, norm over norm), then times
both, as kernels/sparse_mla.py would run them (the split grid with its meetings and CTA pairs), and
FlashMLA's sparse decode, in CUDA graphs, alternating their order, best of three. Past a wave of
unsplit programs it also times `waves`: the rows of the whole waves on the split grid (unsplit, CTA
pairs at 128 heads), then the rest on a balanced grid (WAVE_ROWS). Where the balanced grid runs as
CTA pairs (FP8 at 128 heads) it also times it with one CTA a head block (`balanced_one_cta`).
`chosen` says which mla_config picks.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from dsa_kernels import dispatch, sparse_mla
from graph_timing import alternating_us
from mla_bench import random_fp8_pool, save_rows

SLOTS, TOPK, SCALE = 262144, 2048, 576**-0.5


def _one_cta(fn):
    """fn with CTA pairs off (sparse_mla_gluon.PAIRS), as a capture records it too."""
    def run():
        pairs, sparse_mla.sparse_mla_gluon.PAIRS = sparse_mla.sparse_mla_gluon.PAIRS, False
        try:
            return fn()
        finally:
            sparse_mla.sparse_mla_gluon.PAIRS = pairs
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:33,34,40,44,48,66,67,80,90,100,110,115,116,128;64:67,80,88,100,133,180,231")
    ap.add_argument("--json", default="mla_balanced.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    pool = random_fp8_pool(SLOTS)
    rows, sms = [], torch.cuda.get_device_properties(0).multi_processor_count
    for spec in args.shapes.split(";"):
        heads, batches = spec.split(":")
        heads = int(heads)
        for batch in map(int, batches.split(",")):
            q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, SLOTS, (batch, TOPK), device="cuda").int()
            idx[0, 1000:] = -1
            if batch > 1:
                idx[-1] = -1
            config = sparse_mla.mla_config(batch, heads, TOPK, sms)
            chosen = "split" if not config["BALANCED"] else "waves" if config.get("WAVE_ROWS") else "balanced"
            configs = dict(split=dict(config, BALANCED=False), balanced=dict(config, BALANCED=True, WAVE_ROWS=0))
            wave = sms * 64 // heads  # rows a wave of unsplit programs takes
            if batch > wave and batch % wave:
                configs["waves"] = dict(config, SPLIT=1, BALANCED=True, WAVE_ROWS=batch // wave * wave)
            fns = {name: functools.partial(sparse_mla.sparse_mla, q, pool, idx, SCALE, config=c, gluon=True)
                   for name, c in configs.items()}
            if sparse_mla.sparse_mla_gluon.balanced_pairs(heads, True):  # the balanced grid in CTA pairs: also without
                configs["balanced_one_cta"] = configs["balanced"]
                fns["balanced_one_cta"] = _one_cta(fns["balanced"])
            fns["flashmla"] = lambda: dispatch._flashmla_decode(q, pool, idx, SCALE)
            a, la = fns["split"]()
            r = dict(heads=heads, batch=batch, split=config["SPLIT"], chosen=chosen)
            for name in configs.keys() - {"split"}:
                b, lb = fns[name]()
                finite = torch.isfinite(la)
                r[name + "_rel_err"] = float((a.float() - b.float()).norm() / a.float().norm())
                r[name + "_lse_same"] = bool(torch.equal(torch.isinf(la), torch.isinf(lb))
                                             and torch.allclose(la[finite], lb[finite], rtol=1e-5, atol=1e-5))
            times = alternating_us(fns)
            r.update({name + "_us": t for name, t in times.items()})
            best = {name: min(t) for name, t in times.items()}
            for name in configs.keys() - {"split"}:
                r[name + "_vs_split"] = round(best["split"] / best[name], 3)
            for name in configs:
                r[name + "_vs_flashmla"] = round(best["flashmla"] / best[name], 3)
            rows.append(r)
            print(json.dumps(r), flush=True)
            save_rows(args.json, rows)


if __name__ == "__main__":
    main()

"""FP8 sparse MLA at 128 heads: CTA pairs against one CTA a head block, FlashMLA beside, in one device call.

    source .device/setup.sh && python3 benchmarks/bench_mla_pairs.py [--batches 1,2,8,32,64,100,128] [--min-tiles 32] [--json F]

For each batch (top-k 2048 over a 256K-slot FP8 pool, a short and an empty row among them) it checks
that the two give the same bits, then times both and FlashMLA's sparse decode in CUDA graphs,
alternating their order, best of three. Only programs of --min-tiles tiles run as pairs (by default
sparse_mla_gluon.PAIR_MIN_TILES, 32: unsplit rows); elsewhere the two are one kernel, and `paired`
says which ran.
"""

from __future__ import annotations

import argparse
import json

import torch

from dsa_kernels import cta_pair, dispatch, sparse_mla
from dsa_kernels import sparse_mla_gluon as gluon_mla
from graph_timing import alternating_us
from mla_bench import random_fp8_pool, save_rows

SLOTS, TOPK, SCALE = 262144, 2048, 576**-0.5


def with_pairs(fn, on: bool):
    def run():
        gluon_mla.PAIRS = on
        try:
            return fn()
        finally:
            gluon_mla.PAIRS = True
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,8,32,64,100,128")
    ap.add_argument("--json", default="mla_pairs.json")
    ap.add_argument("--min-tiles", type=int, default=gluon_mla.PAIR_MIN_TILES,
                    help="sparse_mla_gluon.PAIR_MIN_TILES for this run: pairs for programs this long or longer")
    args = ap.parse_args()
    gluon_mla.PAIR_MIN_TILES = args.min_tiles
    torch.manual_seed(0)
    pool = random_fp8_pool(SLOTS)
    launches = []
    real_launch = cta_pair.launch
    cta_pair.launch = lambda *a, **k: launches.append(a[1]) or real_launch(*a, **k)
    rows = []
    for batch in map(int, args.batches.split(",")):
        q = torch.randn(batch, 128, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (batch, TOPK), device="cuda").int()
        idx[0, 1000:] = -1
        if batch > 1:
            idx[-1] = -1
        call = lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE)
        fns = dict(pairs=with_pairs(call, True), one_cta=with_pairs(call, False),
                   flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
        launches.clear()
        a, la = fns["pairs"]()
        paired = bool(launches)
        b, lb = fns["one_cta"]()
        torch.cuda.synchronize()
        r = dict(batch=batch, split=sparse_mla.mla_config(batch, 128, TOPK)["SPLIT"], paired=paired,
                 pairs_enabled=gluon_mla.PAIRS, equal=bool(torch.equal(a, b) and torch.equal(la, lb)))
        times = alternating_us(fns)
        r.update({name + "_us": t for name, t in times.items()})
        best = {name: min(t) for name, t in times.items()}
        r.update(pairs_vs_one=round(best["one_cta"] / best["pairs"], 3),
                 pairs_vs_flashmla=round(best["flashmla"] / best["pairs"], 3),
                 one_vs_flashmla=round(best["flashmla"] / best["one_cta"], 3))
        rows.append(r)
        print(json.dumps(r), flush=True)
        save_rows(args.json, rows)


if __name__ == "__main__":
    main()

"""Tile sweep of the paged indexer-logits kernel against DeepGEMM, CUDA-graph times, one device call.

    source .device/setup.sh && python3 benchmarks/sweep_indexer.py [--json F]

For batch 32 and 128 at 32K keys and next_n 1 / 2 / 4 it times key chunk per program, warps and
pipeline stages and key loads (gathered or TMA) of dsa_kernels.indexer_logits' paged kernel, checks the fastest against the
default config's output, and prints it next to DeepGEMM's fp8_paged_mqa_logits and the default.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch

from dsa_kernels import dispatch, indexer_logits
from graph_timing import graph_ms
from indexer_bench import random_index_pool

PAGE, CTX = 64, 32768


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pages = 128 * CTX // PAGE + 64
    pool = random_index_pool(pages, PAGE)
    results = []
    for batch, next_n in itertools.product((32, 128), (1, 2, 4)):
        table = torch.randperm(pages, device="cuda")[: batch * CTX // PAGE].view(batch, -1).int()
        lens = torch.stack([torch.full((batch,), CTX - next_n + j + 1, device="cuda") for j in range(next_n)],
                           1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        default = indexer_logits.paged_config(batch, CTX, next_n, sms)
        want = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, CTX, next_n, clean_logits=False)
        timed = []
        for kpp, warps, stages, tma in itertools.product((512, 1024, 2048), (4, 8), (2, 3, 4), (False, True)):
            cfg = dict(BLOCK_K=64, KEYS_PER_PROG=kpp, num_warps=warps, num_stages=stages, TMA=tma)
            fn = lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, CTX, next_n,  # noqa: E731
                                                             clean_logits=False, config=cfg)
            try:
                timed.append((graph_ms(fn), cfg))
            except Exception as exc:  # noqa: BLE001 - a tile that does not fit
                print("failed", cfg, str(exc)[:120])
        timed.sort(key=lambda t: t[0])
        best_ms, best = timed[0]
        got = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, CTX, next_n, clean_logits=False,
                                                  config=best)
        finite = torch.isfinite(want)
        same = bool(torch.allclose(got[finite], want[finite], rtol=1e-3, atol=1e-3))
        default_ms = graph_ms(lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, CTX, next_n,
                                                                          clean_logits=False))
        try:
            dg_ms = graph_ms(lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, CTX, next_n, False))
        except Exception as exc:  # noqa: BLE001
            dg_ms = math.nan
            print("deepgemm", str(exc)[:120])
        row = dict(batch=batch, next_n=next_n, best_ms=round(best_ms, 5), best=best, default_ms=round(default_ms, 5),
                   default=default, deepgemm_ms=round(dg_ms, 5), best_over_deepgemm_speed=round(dg_ms / best_ms, 3),
                   default_over_deepgemm_speed=round(dg_ms / default_ms, 3), best_matches_default=same,
                   top3=[(round(t, 5), c) for t, c in timed[:3]])
        print(json.dumps(row), flush=True)
        results.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""Tile and split sweep of the Triton sparse MLA decode kernel against FlashMLA, in one device call.

    source .device/setup.sh && python3 benchmarks/sweep_sparse_mla.py [--batches 1,32,128] [--json F]
    source .device/setup.sh && python3 benchmarks/sweep_sparse_mla.py --gluon [--heads 64,128]

With --gluon it sweeps only the top-k split of the Gluon kernel (its tile is fixed), every split
from 1 to 8 that keeps a tile per program and at most four waves, timed in CUDA graphs as the
engine replays it (do_bench would add two Python launches to a ~50 us kernel).

For each (heads, batch) on the FP8 cache it times tile configurations (BLOCK_H 16/32/64, BLOCK_N,
warps, stages) with top-k splits that put a quarter to four waves of programs on the SMs, checks
the fastest against the float32 reference, and records it next to the default mla_config and
FlashMLA's sparse decode on the same inputs. The JSON is rewritten after every case, so a stage
cut off by its timeout still leaves the finished ones.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton.testing

from dsa_kernels import dispatch, reference, sparse_mla
from graph_timing import graph_ms
from mla_bench import random_fp8_pool, save_rows

K, SLOTS, SCALE = 2048, 262144, 576**-0.5
# (BLOCK_H, BLOCK_N, warps, stages): 16/32-head blocks run mma v2, whose operands live in
# registers, so they get 4 warps and short pipelines; 64 heads run wgmma (operands in shared
# memory). 16 tiles, each compiled twice (final and split output): the compile dominates the run.
TILES = [(16, 32, 4, 1), (16, 64, 4, 1), (16, 32, 4, 2), (16, 64, 4, 2),
         (32, 32, 4, 1), (32, 64, 4, 1), (32, 32, 8, 1), (32, 64, 8, 1),
         (64, 32, 4, 1), (64, 64, 4, 1), (64, 32, 8, 1), (64, 64, 8, 1),
         (64, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 2), (64, 64, 8, 3)]


def _ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def _configs(batch: int, heads: int, sms: int):
    """Every tile with each power-of-two split giving sms/4 .. 4*sms programs, else the nearest one."""
    for bh, bn, warps, stages in TILES:
        if heads % bh:
            continue
        programs = batch * heads // bh
        splits = [1 << i for i in range(12) if K >> i >= bn]  # every split keeps at least one tile
        fit = [s for s in splits if sms // 4 <= programs * s <= 4 * sms]
        for split in fit or [splits[0] if programs > 4 * sms else splits[-1]]:
            yield dict(BLOCK_H=bh, BLOCK_N=bn, SPLIT=split, num_warps=warps, num_stages=stages)


def _gluon_configs(batch: int, heads: int, sms: int):
    """The default config with every split 1..8 that keeps a tile per split and at most four waves."""
    default = sparse_mla.mla_config(batch, heads, K, sms)
    programs = batch * heads // sparse_mla.sparse_mla_gluon.BLOCK_H
    for split in range(1, 9):
        if K // split >= sparse_mla.sparse_mla_gluon.BLOCK_N and programs * split <= 4 * sms:
            yield dict(default, SPLIT=split)


def _case(pool, heads: int, batch: int, sms: int, deadline: float, gluon: bool = False) -> dict:
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, K), device="cuda").int()
    flops = 2 * batch * heads * K * (576 + 512)
    default = sparse_mla.mla_config(batch, heads, K, sms)
    time_ms, run = (graph_ms, dict(gluon=True)) if gluon else (_ms, {})
    t0, timed, skipped = time.time(), [], 0
    for cfg in (_gluon_configs if gluon else _configs)(batch, heads, sms):
        if time.time() > deadline:  # leave time for the later cases' defaults and FlashMLA
            skipped += 1
            continue
        try:
            timed.append((time_ms(lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=cfg, **run)), cfg))
        except Exception as exc:  # noqa: BLE001 - a tile that does not fit (shared memory, registers)
            timed.append((float("inf"), dict(cfg, error=str(exc)[:80])))
    timed.sort(key=lambda t: t[0])
    best_ms, best = timed[0] if timed else (float("inf"), default)
    default_ms = time_ms(lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=default, **run))
    if default_ms < best_ms:
        best_ms, best = default_ms, default
    out, _ = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=best, **run)
    ref, _ = reference.sparse_mla_ref(q[:8], pool, idx[:8], SCALE)
    fm_ms = time_ms(lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
    best_per_block_h = {}
    for ms, cfg in reversed(timed):
        best_per_block_h[cfg["BLOCK_H"]] = dict(ms=round(ms, 5), cfg=cfg)
    return dict(
        heads=heads, batch=batch, flashmla_ms=round(fm_ms, 5),
        best_ms=round(best_ms, 5), best=best, best_speed_over_flashmla=round(fm_ms / best_ms, 3),
        best_TFLOPs=round(flops / best_ms / 1e9),
        rel_err=round(float((out[:8].float() - ref).norm() / ref.norm()), 5),
        default_ms=round(default_ms, 5), default=default, default_speed_over_flashmla=round(fm_ms / default_ms, 3),
        best_per_block_h=best_per_block_h, fastest=[dict(ms=round(ms, 5), cfg=c) for ms, c in timed[:8]],
        configs=len(timed), skipped=skipped, failed=sum(ms == float("inf") for ms, _ in timed),
        sweep_s=round(time.time() - t0, 1),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--heads", default="128")
    ap.add_argument("--budget", type=float, default=230, help="seconds of sweeping before only defaults run")
    ap.add_argument("--gluon", action="store_true", help="sweep the Gluon kernel's split only (CUDA graphs)")
    ap.add_argument("--json")
    a = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pool = random_fp8_pool(SLOTS)  # FlashMLA's sparse decode reads FP8 only
    cases = [(int(h), int(b)) for h in a.heads.split(",") for b in a.batches.split(",")]
    start, rows = time.time(), []
    for i, (heads, batch) in enumerate(cases):
        # the first case compiles most tiles; each later case keeps 20 s for its (cached) timings
        deadline = start + a.budget - 20 * (len(cases) - 1 - i)
        rows.append(_case(pool, heads, batch, sms, deadline, a.gluon))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("fastest", "best_per_block_h")}), flush=True)
        if a.json:
            save_rows(a.json, rows)
    for r in rows:
        print(f"batch {r['batch']}: best {r['best_ms']} ms ({r['best_speed_over_flashmla']}x FlashMLA {r['flashmla_ms']} ms)"
              f" {r['best']}; default {r['default_ms']} ms ({r['default_speed_over_flashmla']}x);"
              f" per BLOCK_H {json.dumps({h: v['ms'] for h, v in r['best_per_block_h'].items()})}", flush=True)
        if a.gluon:
            print("  splits:", {t["cfg"]["SPLIT"]: t["ms"] for t in r["fastest"]}, flush=True)


if __name__ == "__main__":
    main()

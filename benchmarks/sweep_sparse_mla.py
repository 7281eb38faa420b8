"""Tile sweep of the Triton sparse MLA decode kernel against FlashMLA, in one device call.

    source .device/setup.sh && python3 benchmarks/sweep_sparse_mla.py [--batches 1,32,128] [--json F]

For each (cache, heads, batch) it times every tile configuration (BLOCK_H, BLOCK_N, warps, stages,
split of the top-k range), checks the fastest against the float32 reference, and prints it next
to FlashMLA's sparse decode on the same inputs (FP8 cache) and the default mla_config.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import triton
import triton.testing

from dsa_kernels import dispatch, reference, sparse_mla

K, SLOTS, SCALE = 2048, 262144, 576**-0.5


def _ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def _configs(batch: int, heads: int, sms: int):
    base = sparse_mla.mla_config(batch, heads, K, sms)
    for bh, bn, warps, stages in itertools.product((32, 64), (32, 64), (4, 8), (1, 2)):
        # the default split is sized for BLOCK_H 64: scale it with the head blocks, then try x0.5 and x2
        for split in {max(base["SPLIT"] * bh // 64 * m // 2, 1) for m in (1, 2, 4)}:
            if heads % bh == 0 and K // split >= bn:
                yield dict(BLOCK_H=bh, BLOCK_N=bn, SPLIT=split, num_warps=warps, num_stages=stages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--heads", default="128")
    ap.add_argument("--json")
    a = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for fp8 in (True,):  # FlashMLA's sparse decode reads the FP8 layout only
        pool = torch.zeros(SLOTS, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
        dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                              torch.arange(SLOTS, device="cuda"))
        for heads, batch in itertools.product(map(int, a.heads.split(",")), map(int, a.batches.split(","))):
            q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, SLOTS, (batch, K), device="cuda").int()
            flops = 2 * batch * heads * K * (576 + 512)
            default = sparse_mla.mla_config(batch, heads, K, sms)
            t0, timed = time.time(), []
            for cfg in {json.dumps(c, sort_keys=True): c for c in _configs(batch, heads, sms)}.values():
                try:
                    timed.append((_ms(lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=cfg)), cfg))
                except Exception as exc:  # noqa: BLE001 - a tile that does not fit (shared memory, registers)
                    timed.append((float("inf"), dict(cfg, error=str(exc)[:80])))
            best_ms, best = min(timed, key=lambda t: t[0])
            out, _ = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=best)
            ref, _ = reference.sparse_mla_ref(q[:8], pool, idx[:8], SCALE)
            err = float((out[:8].float() - ref).norm() / ref.norm())
            default_ms = _ms(lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE, config=default))
            row = dict(fp8=fp8, heads=heads, batch=batch, best_ms=round(best_ms, 5), best=best,
                       best_TFLOPs=round(flops / best_ms / 1e9), default_ms=round(default_ms, 5), default=default,
                       rel_err=round(err, 5), sweep_s=round(time.time() - t0, 1), configs=len(timed))
            if fp8:
                fm_ms = _ms(lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
                row.update(flashmla_ms=round(fm_ms, 5), best_speed_over_flashmla=round(fm_ms / best_ms, 3),
                           default_speed_over_flashmla=round(fm_ms / default_ms, 3))
            results.append(row)
            print(json.dumps(row), flush=True)
        del pool
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=results), f, indent=1)


if __name__ == "__main__":
    main()

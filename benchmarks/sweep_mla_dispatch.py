"""Our sparse MLA decode against FlashMLA's at every row count where "auto" chooses between them
(dispatch._ours_instead_of_flashmla), in one device call.

    source .device/setup.sh && python3 benchmarks/sweep_mla_dispatch.py [--json F]

FP8 pool of 262144 slots, top-k 2048, random slots. CUDA graphs of ~10 ms replayed five times, the
two kernels alternating for two rounds, best of each. "ours" is sparse_mla.sparse_mla with its own
schedule (split grid, CTA pairs, balanced grid, or whole waves and then a balanced grid); each row
records that schedule and what "auto" picks. The JSON is rewritten after every row, so a call cut
off by its timeout keeps the finished rows.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dsa_kernels import dispatch, sparse_mla
from graph_timing import alternating_us
from mla_bench import random_fp8_pool, save_rows

K, SLOTS, SCALE = 2048, 262144, 576**-0.5
# 64 heads: every row to 264 (two waves of 132 SMs); 128 heads: every row to 132, then every 4th.
ROWS = {64: list(range(1, 265)), 128: list(range(1, 133)) + list(range(136, 261, 4))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="/tmp/sweep_mla_dispatch.json")
    parser.add_argument("--heads", default="64,128")
    args = parser.parse_args()
    torch.manual_seed(0)
    kv = random_fp8_pool(SLOTS)
    rows, started = [], time.time()
    for heads in map(int, args.heads.split(",")):
        for n in ROWS[heads]:
            q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, SLOTS, (n, K), device="cuda").int()
            fns = dict(ours=lambda: sparse_mla.sparse_mla(q, kv, idx, SCALE),
                       flashmla=lambda: dispatch._flashmla_decode(q, kv, idx, SCALE))
            times = alternating_us(fns, rounds=2, rep_ms=10.0, replays=5)
            best = {name: min(t) for name, t in times.items()}
            config = sparse_mla.mla_config(n, heads, K, torch.cuda.get_device_properties(0).multi_processor_count)
            schedule = (f"{config['WAVE_ROWS']} rows in waves, balanced" if config["WAVE_ROWS"] else "balanced"
                        if config["BALANCED"] else f"split {config['SPLIT']}")
            auto = "ours" if dispatch._ours_instead_of_flashmla(q, kv, K) else "flashmla"
            row = dict(heads=heads, rows=n, schedule=schedule, us=best, all=times, auto=auto,
                       ours_over_flashmla=round(best["flashmla"] / best["ours"], 3))
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "all"}), flush=True)
            save_rows(args.json, rows, seconds=round(time.time() - started))


if __name__ == "__main__":
    main()

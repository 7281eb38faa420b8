"""Paged indexer logits at next_n 1/2/4: one wide MMA per key tile vs one MMA per token
(TOKEN_LOOP), against DeepGEMM's paged MQA logits, in one device call.

    source .device/setup.sh && python3 benchmarks/sweep_indexer_next_n.py [--json F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import torch
import triton.testing

from dsa_kernels import dispatch, indexer_logits, reference

PAGE = 64


def _ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def _case(batch: int, ctx: int, next_n: int, pool: torch.Tensor):
    pages_per = math.ceil(ctx / PAGE)
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * pages_per].view(batch, pages_per).int()
    seq = torch.full((batch,), ctx, device="cuda")
    lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
    q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
    return q, w, table, lens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    batches, ctx = (32, 128), 32768
    pages = max(batches) * ctx // PAGE + 64
    pool = torch.empty(pages, PAGE * 132, dtype=torch.uint8, device="cuda")
    pool[:, : PAGE * 128] = torch.randn(pages, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
    rows = []
    for batch, next_n in itertools.product(batches, (1, 2, 4)):
        q, w, table, lens = _case(batch, ctx, next_n, pool)
        base = indexer_logits.paged_config(batch, ctx, next_n)
        row = dict(batch=batch, ctx=ctx, next_n=next_n)
        for token_loop, warps in itertools.product((False, True), (4, 8)):
            cfg = dict(base, TOKEN_LOOP=token_loop, num_warps=warps)
            fn = lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n,  # noqa: E731
                                                             clean_logits=False, config=cfg)
            row[f"{'loop' if token_loop else 'wide'}_w{warps}_ms"] = round(_ms(fn), 5)
        out = indexer_logits.paged_indexer_logits(q[: 2 * next_n], w[: 2 * next_n], pool, table[:2], lens[: 2 * next_n],
                                                  PAGE, ctx, next_n, config=dict(base, TOKEN_LOOP=True))
        want = reference.paged_indexer_logits_ref(q[: 2 * next_n], w[: 2 * next_n], pool, table[:2],
                                                  lens[: 2 * next_n], PAGE, ctx, next_n)
        fin = torch.isfinite(want)
        row["loop_max_err_over_max"] = float((out[fin] - want[fin]).abs().max() / want[fin].abs().max())
        if next_n <= 2:
            try:
                row["deepgemm_ms"] = round(_ms(lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx,
                                                                                  next_n, False)), 5)
            except Exception as exc:  # noqa: BLE001
                row["deepgemm_error"] = str(exc)[:120]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

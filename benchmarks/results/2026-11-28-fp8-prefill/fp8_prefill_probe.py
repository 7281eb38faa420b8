"""Session 58: sparse MLA of a prefill step over an FP8 pool, FlashMLA's FP8 decode kernel a row a
token (as before) against the requests' rows gathered to bf16 + FlashMLA's sparse prefill kernel."""
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
import dsa_kernels  # noqa: E402
from dsa_kernels import cache_store  # noqa: E402
from graph_timing import graph_ms  # noqa: E402

HEADS, TOPK, SCALE = int(os.environ.get("HEADS", 128)), 2048, 576 ** -0.5
CASES = [(64, 64), (128, 128), (256, 256), (512, 512), (1024, 1024), (4096, 4096), (8192, 8192),
         (256, 32768), (2048, 32768), (2048, 131072), (512, 131072)]
if os.environ.get("CASES") == "small":  # below 64 tokens, and the 64-head grid's own shapes
    CASES = [(16, 16), (32, 32), (64, 64), (256, 256), (1024, 1024), (8192, 8192), (2048, 32768), (512, 131072)]
slots_total = 131072 + 64
pool = torch.zeros(slots_total, 656, dtype=torch.uint8, device="cuda")
for s in range(0, slots_total, 16384):
    n = min(16384, slots_total - s)
    cache_store.store_mla(pool, torch.randn(n, 512, device="cuda"), torch.randn(n, 64, device="cuda"),
                          torch.arange(s, s + n, device="cuda"))
out = []
for q_len, ctx in CASES:
    g = torch.Generator(device="cuda").manual_seed(q_len + ctx)
    q = torch.randn(q_len, HEADS, 576, device="cuda", generator=g).bfloat16()
    pos = torch.arange(ctx - q_len, ctx, device="cuda")
    rand = (torch.rand(q_len, TOPK, device="cuda", generator=g) * (pos[:, None] + 1)).long()
    dense = torch.arange(TOPK, device="cuda")[None, :].expand(q_len, TOPK)
    idx = torch.where((pos[:, None] + 1) <= TOPK, torch.where(dense <= pos[:, None], dense, -1), rand).int().contiguous()
    rows = torch.arange(ctx, device="cuda", dtype=torch.int32)

    def decode():
        return dsa_kernels.sparse_mla_decode(q, pool, idx, SCALE)

    def gathered():
        return dsa_kernels.sparse_mla_prefill(q, dsa_kernels.gather_kv_rows(pool, rows), idx, SCALE)

    a, b = decode()[0].float(), gathered()[0].float()
    kv = dsa_kernels.gather_kv_rows(pool, rows)
    row = dict(heads=HEADS, q=q_len, ctx=ctx, rel_diff=round(float((a - b).norm() / a.norm()), 5),
               decode_us=round(graph_ms(decode) * 1e3, 1), gathered_us=round(graph_ms(gathered) * 1e3, 1),
               gather_us=round(graph_ms(lambda: dsa_kernels.gather_kv_rows(pool, rows)) * 1e3, 1),
               prefill_us=round(graph_ms(lambda: dsa_kernels.sparse_mla_prefill(q, kv, idx, SCALE)) * 1e3, 1))
    flops = 2 * q_len * HEADS * TOPK * (576 + 512)
    row["decode_tflops"] = round(flops / row["decode_us"] / 1e6, 1)
    row["gathered_tflops"] = round(flops / row["gathered_us"] / 1e6, 1)
    row["gathered_over_decode"] = round(row["decode_us"] / row["gathered_us"], 3)
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)

"""What a batch-independent split-K costs sparse MLA decode: our Gluon kernel at mla_config's split
(which falls with the batch) against fixed splits 1 / 2 / 4 / 8, at DeepSeek-V3.2 sizes (top-k
2048), FP8 and bf16 pools, 64 and 128 heads. CUDA-graph medians, best of two; FlashMLA in the
same call for reference. Also whether FlashMLA's sparse prefill gives a row the same bits alone
and inside a batch."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

import dsa_kernels  # noqa: E402
from dsa_kernels import sparse_mla  # noqa: E402

torch.manual_seed(0)
TOPK, SLOTS = 2048, 1 << 18
pool_bf16 = (torch.randn(SLOTS, 576, device="cuda") * 0.5).to(torch.bfloat16)
pool_fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dsa_kernels.store_mla_kv(pool_fp8, pool_bf16[:, :512].float(), pool_bf16[:, 512:].float(),
                         torch.arange(SLOTS, device="cuda"))
rows = []
for heads in (128, 64):
    for pool_name, pool in (("fp8", pool_fp8), ("bf16", pool_bf16)):
        for batch in (1, 4, 16, 32, 64, 128):
            q = (torch.randn(batch, heads, 576, device="cuda") * 0.5).to(torch.bfloat16)
            idx = torch.stack([torch.randperm(SLOTS, device="cuda")[:TOPK] for _ in range(batch)]).int()
            default = sparse_mla.mla_config(batch, heads, TOPK)["SPLIT"]
            fns = {f"default (split {default})": lambda: sparse_mla.sparse_mla(q, pool, idx, 0.0417)}
            for s in (1, 2, 4, 8):
                fns[f"split {s}"] = lambda s=s: sparse_mla.sparse_mla(
                    q, pool, idx, 0.0417, config=dict(sparse_mla.mla_config(batch, heads, TOPK), SPLIT=s), gluon=True)
            if pool_name == "fp8":
                fns["flashmla"] = lambda: dsa_kernels.sparse_mla_decode(q, pool, idx, 0.0417, backend="flashmla")
            times = {k: [] for k in fns}
            for _ in range(2):
                for k, f in fns.items():
                    times[k].append(graph_ms(f))
            row = dict(heads=heads, pool=pool_name, batch=batch, us={k: round(min(v) * 1e3, 2) for k, v in times.items()})
            print(json.dumps(row), flush=True)
            rows.append(row)
# FlashMLA's sparse prefill: the first rows alone against inside 4096 queries
q = (torch.randn(4096, 128, 576, device="cuda") * 0.5).to(torch.bfloat16)
idx = torch.randint(0, SLOTS, (4096, TOPK), device="cuda", dtype=torch.int32)
whole = dsa_kernels.sparse_mla_prefill(q, pool_bf16, idx, 0.0417, backend="flashmla")[0]
prefill = {n: bool(torch.equal(dsa_kernels.sparse_mla_prefill(q[:n], pool_bf16, idx[:n], 0.0417,
                                                              backend="flashmla")[0], whole[:n])) for n in (1, 64, 512)}
print(json.dumps(dict(flashmla_prefill_rows_alone_equal=prefill)), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "fixed_split_cost.json"), "w") as f:
    json.dump(dict(rows=rows, flashmla_prefill_rows_alone_equal=prefill), f, indent=1)

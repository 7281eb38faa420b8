"""Speculative decoding verifies at next_n 2 or 4 what plain decoding scores at next_n 1. Under auto,
DeepGEMM serves next_n 1 and 2 and our kernel next_n 4 (DeepGEMM refuses it on SM90). Are
DeepGEMM's paged logits and ours equal bit for bit, so that a token scores the same either way?"""

import json

import torch

import dsa_kernels

torch.manual_seed(0)
PAGE, CTX = 64, 32768
res = {}
for batch in (1, 32):
    pages = batch * CTX // PAGE + 1
    pool = torch.zeros(pages, PAGE * 132, dtype=torch.uint8, device="cuda")
    dsa_kernels.store_index_keys(pool, torch.randn(pages * PAGE, 128, device="cuda"),
                                 torch.arange(pages * PAGE, device="cuda"), PAGE)
    table = torch.randperm(pages, device="cuda")[: batch * CTX // PAGE].view(batch, -1).int()
    for next_n in (1, 2):
        lens = torch.stack([torch.full((batch,), CTX - next_n + j + 1, device="cuda") for j in range(next_n)],
                           1).reshape(-1).int()
        q = (torch.randn(batch * next_n, 64, 128, device="cuda") * 2).to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda")
        out = {b: dsa_kernels.paged_indexer_logits(q, w, pool, table, lens, page_size=PAGE, max_context_len=CTX,
                                                   next_n=next_n, backend=b) for b in ("deepgemm", "triton")}
        inside = torch.arange(CTX, device="cuda")[None, :] < lens[:, None]
        a, b = out["deepgemm"][inside], out["triton"][inside]
        rel = ((a - b).abs() / b.abs().clamp_min(1e-6))
        res[f"batch {batch}, next_n {next_n}"] = dict(equal=bool(torch.equal(a, b)), differing=int((a != b).sum()),
                                                     of=int(a.numel()), max_rel_diff=float(rel.max()))
print(json.dumps(res, indent=1))

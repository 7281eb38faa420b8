"""A decode token's indexer logits by the paged kernel (a DECODE batch) and by the ragged kernel
over its request's gathered keys (the same token inside a mixed EXTEND batch, as
KernelDsaBackend._ragged_logits computes them): equal bit for bit? Ours and DeepGEMM's, at
DeepSeek-V3.2's 64 heads, 4 requests of 5000-33000 keys, pages of 64."""

import json

import torch

import dsa_kernels
from dsa_kernels import reference

torch.manual_seed(0)
PAGE = 64
seq = torch.tensor([5000, 33000, 17, 12345])
width = int(seq.max()) // PAGE + 1
pages = len(seq) * width + 8
pool = torch.zeros(pages, PAGE * 132, dtype=torch.uint8, device="cuda")
dsa_kernels.store_index_keys(pool, torch.randn(pages * PAGE, 128, device="cuda"), torch.arange(pages * PAGE, device="cuda"),
                             PAGE)
table = torch.randperm(pages, device="cuda")[: len(seq) * width].view(len(seq), width).int()
lens = seq.int().cuda()
q = (torch.randn(len(seq), 64, 128, device="cuda") * 2).to(torch.float8_e4m3fn)
w = torch.randn(len(seq), 64, device="cuda")
res = {}
for backend in ("triton", "deepgemm"):
    paged = dsa_kernels.paged_indexer_logits(q, w, pool, table, lens, page_size=PAGE, max_context_len=int(seq.max()),
                                             clean_logits=False, backend=backend)
    base = torch.cumsum(seq, 0) - seq
    req = torch.repeat_interleave(torch.arange(len(seq)), seq)
    pos = torch.arange(int(seq.sum())) - base[req]
    slots = table.long().cpu()[req, pos // PAGE] * PAGE + pos % PAGE
    k_fp8, k_scale = reference.gather_index_keys_ref(pool, slots.cuda(), PAGE)
    start = base.int().cuda()
    ragged = dsa_kernels.ragged_indexer_logits(q, w, k_fp8.contiguous(), k_scale, start, start + lens,
                                               clean_logits=False, backend=backend)
    same = []
    for r in range(len(seq)):
        a, b = paged[r, : seq[r]], ragged[r, base[r]: base[r] + seq[r]]
        same.append(dict(equal=bool(torch.equal(a, b)), max_abs_diff=float((a - b).abs().max()),
                         differing=int((a != b).sum())))
    res[backend] = same
print(json.dumps(res, indent=1))

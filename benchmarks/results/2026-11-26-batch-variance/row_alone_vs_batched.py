"""Does a row's output depend on the batch it runs in, at DeepSeek-V3.2's sizes? The first rows of a
batch of 32 (and 128) against the same rows run alone, bit for bit, for every kernel the engine's
KernelDsaBackend reaches: sparse MLA decode (FP8 pool: FlashMLA under auto, and ours; bf16 pool:
ours), the paged indexer logits (DeepGEMM under auto, and ours) and the top-k."""

import json

import torch

import dsa_kernels
from dsa_kernels import dispatch

torch.manual_seed(0)
PAGE, HEADS, TOPK, SLOTS = 64, 128, 2048, 1 << 18
res = {"backends": dispatch.available_backends("cuda")}


def compare(name, fn, big):
    """fn(n) -> tensor for the first n rows; the first rows alone against inside a batch of `big`."""
    whole = fn(big)
    for alone_n in (1, 4):
        alone = fn(alone_n)
        same = bool(torch.equal(alone, whole[:alone_n]))
        diff = (alone.float() - whole[:alone_n].float()).abs().max().item()
        res[f"{name}, {alone_n} of {big}"] = dict(same=same, max_abs_diff=diff)


# sparse MLA decode
q = (torch.randn(128, HEADS, 576, device="cuda") * 0.5).to(torch.bfloat16)
idx = torch.stack([torch.randperm(SLOTS, device="cuda")[:TOPK] for _ in range(128)]).int()
pool_bf16 = (torch.randn(SLOTS, 576, device="cuda") * 0.5).to(torch.bfloat16)
pool_fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dsa_kernels.store_mla_kv(pool_fp8, pool_bf16[:, :512].float(), pool_bf16[:, 512:].float(),
                         torch.arange(SLOTS, device="cuda"))
for pool_name, pool in (("fp8", pool_fp8), ("bf16", pool_bf16)):
    for backend in ("auto", "triton"):
        for big in (32, 128):
            compare(f"sparse MLA {pool_name} {backend}",
                    lambda n, pool=pool, backend=backend: dsa_kernels.sparse_mla_decode(
                        q[:n], pool, idx[:n], 0.0417, backend=backend)[0], big)

# paged indexer logits, next_n 1
ctx = 32768
ipool = torch.zeros(128 * ctx // PAGE + 1, PAGE * 132, dtype=torch.uint8, device="cuda")
dsa_kernels.store_index_keys(ipool, torch.randn(ipool.shape[0] * PAGE, 128, device="cuda"),
                             torch.arange(ipool.shape[0] * PAGE, device="cuda"), PAGE)
table = torch.randperm(ipool.shape[0], device="cuda")[: 128 * ctx // PAGE].view(128, -1).int()
lens = (ctx - torch.arange(128, device="cuda") * 7).int()
qi = torch.randn(128, 64, 128, device="cuda").to(torch.float8_e4m3fn)
wi = torch.randn(128, 64, device="cuda") * 0.1
for backend in ("auto", "triton"):
    for big in (32, 128):
        compare(f"indexer {backend}", lambda n, backend=backend: dsa_kernels.paged_indexer_logits(
            qi[:n], wi[:n], ipool, table[:n], lens[:n], page_size=PAGE, max_context_len=ctx, backend=backend),
            big)
print(json.dumps(res, indent=1))

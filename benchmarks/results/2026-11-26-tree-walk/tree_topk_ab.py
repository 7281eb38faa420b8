"""KernelDsaBackend._tree_topk before and after the ancestors' logits moved in place behind each
token's prefix (before: a [tokens, max seq_len] int64 table of every token's visible positions and
a gather of the logits through it; after: a [tokens, depth] gather and scatter on the logits).
Both take the same shared page walk, so the difference is the relayout. DeepSeek-V3.2 indexer
shapes (64 heads x 128, page 64, top-k 2048); draft trees of n nodes in heap order (node i's
parent (i - 1) // 2). Eager medians (triton do_bench; the path syncs with the host), and the
paged logits call alone for what the relayout and top-k add to it. Picks compared exactly."""

import json
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import dsa_kernels  # noqa: E402
from dsa_backend.attention import KernelDsaBackend, request_of_token  # noqa: E402
from dsa_backend.batch import ForwardBatch, ForwardMode, TreeLayout  # noqa: E402

PAGE, TOPK = 64, 2048
SHAPES = [(1, 32768, 8), (32, 4096, 8), (32, 32768, 8), (32, 32768, 16), (128, 4096, 8), (128, 32768, 8),
          (32, 131072, 8)]


def heap_tree(n):
    paths = []
    for i in range(n):
        path = [i]
        while path[-1]:
            path.append((path[-1] - 1) // 2)
        paths.append(tuple(reversed(path)))
    return TreeLayout(tuple(paths))


def before(q_fp8, w, keys, batch, context, topk):
    every_key = batch.seq_lens[request_of_token(batch)].to(torch.int32).view(-1, 1)
    logits = KernelDsaBackend._paged_logits(q_fp8, w, keys, batch, every_key, clean_logits=True)
    visible = batch.tree.visible_positions(slice(None), int(context.max()))
    zeros = torch.zeros(batch.num_tokens, dtype=torch.int32, device=q_fp8.device)
    picked = dsa_kernels.topk_transform(logits.gather(1, visible), context, topk, "ragged", offsets=zeros)
    return torch.where(picked >= 0, visible.gather(1, picked.long().clamp_min(0)), -1).to(torch.int32)


rows = []
max_pages = max(b * (c // PAGE + 1) for b, c, _ in SHAPES)
pool = torch.empty(max_pages + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
for batch_size, ctx, n in SHAPES:
    pages_per = (ctx + n + PAGE - 1) // PAGE
    perm = torch.randperm(pool.shape[0])[: batch_size * pages_per].view(batch_size, pages_per).tolist()
    batch = ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[1] * n] * batch_size, [ctx] * batch_size, perm, PAGE,
                               "cuda", all_logits=True, trees=[heap_tree(n)] * batch_size)
    context = (batch.positions + 1).to(torch.int32).view(-1, 1)
    q = torch.randn(batch.num_tokens, 64, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch.num_tokens, 64, device="cuda") * 0.1
    every_key = batch.seq_lens[request_of_token(batch)].to(torch.int32).view(-1, 1)
    fns = {
        "before": lambda: before(q, w, pool, batch, context, TOPK),
        "after": lambda: KernelDsaBackend._tree_topk(q, w, pool, batch, context, TOPK),
        "logits_alone": lambda: KernelDsaBackend._paged_logits(q, w, pool, batch, every_key, clean_logits=False),
    }
    same = bool(torch.equal(fns["before"](), fns["after"]()))
    times = {k: [] for k in fns}
    for _ in range(2):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench(f, warmup=5, rep=40, return_mode="median"))
    us = {k: round(min(v) * 1000, 1) for k, v in times.items()}
    row = dict(batch=batch_size, ctx=ctx, tree=n, us=us, same=same, speedup=round(us["before"] / us["after"], 3),
               added_before=round(us["before"] - us["logits_alone"], 1),
               added_after=round(us["after"] - us["logits_alone"], 1))
    print(json.dumps(row), flush=True)
    rows.append(row)
    del batch, q, w
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "tree_topk_ab.json"), "w") as f:
    json.dump(rows, f, indent=1)

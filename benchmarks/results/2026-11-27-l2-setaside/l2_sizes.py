"""Set-aside size against a plain copy's slowdown and the indexer's gain (limit set directly)."""
import json, math, os, sys, time
sys.path.insert(0, "benchmarks/results/2026-11-27-l2-setaside")
import torch
from l2win_ab import set_persisting
from l2win_nextn import graph_us
from dsa_kernels import indexer_logits

DEV, PAGE = "cuda", 64
OUT = os.environ.get("OUT", ".")
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), rows=[])
pages = 65536 + 64
pool = torch.empty(pages, PAGE * 132, dtype=torch.uint8, device=DEV)
pool[:, : PAGE * 128] = torch.randn(pages, PAGE * 128, device=DEV).to(torch.float8_e4m3fn).view(torch.uint8)
pool[:, PAGE * 128:] = (torch.rand(pages, PAGE, device=DEV) * 0.02 + 0.01).view(torch.uint8)
src = torch.empty(1 << 28, device=DEV)  # 1 GiB
dst = torch.empty_like(src)
small_src, small_dst = src[: 1 << 22], dst[: 1 << 22]  # 16 MiB
fns = {"copy 1 GiB": lambda: dst.copy_(src), "copy 16 MiB": lambda: small_dst.copy_(small_src)}
for batch, ctx, next_n in [(32, 32768, 1), (32, 32768, 2), (128, 32768, 1)]:
    per = math.ceil(ctx / PAGE)
    table = torch.randperm(pages, device=DEV)[: batch * per].view(batch, per).int()
    lens = torch.full((batch * next_n,), ctx, device=DEV, dtype=torch.int32)
    q = torch.randn(batch * next_n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, 64, device=DEV) * 0.1
    fns[f"indexer {batch}/{ctx} n{next_n}"] = (lambda q=q, w=w, table=table, lens=lens, ctx=ctx, next_n=next_n:
        indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False))
sizes = [0, 4 << 20, 8 << 20, 16 << 20, 25 << 20]
for r in range(2):
    for name, fn in fns.items():
        for size in (sizes if r % 2 == 0 else sizes[::-1]):
            got = set_persisting(size)
            us, _ = graph_us(fn, False)
            R["rows"].append(dict(what=name, setaside=got, round=r, us=us))
            print(json.dumps(R["rows"][-1]), flush=True)
            json.dump(R, open(os.path.join(OUT, "l2_sizes.json"), "w"), indent=1)

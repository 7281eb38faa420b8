"""The set-aside alone (one context limit, no window: the indexer's evict_last stores use it) at
SIXTEENTHS/16 of L2 (default 3; the driver rounds it to its granule) on and off, alternating,
over: our indexer alone, indexer + top-k, sparse MLA decode (FP8, 128 heads) alone, the weight
GEMM alone, a 656 MB copy, and L layers of the first four (each layer's own keys, KV, weights).
source .device/setup.sh && python3 benchmarks/results/2026-11-27-l2-setaside/l2_layers2.py"""
import json, math, os, sys, time
sys.path.insert(0, "benchmarks/results/2026-11-27-l2-setaside")
import torch
from l2win_ab import L2, MAX_PERSIST, set_persisting
from l2win_nextn import graph_us
from dsa_kernels import dispatch, indexer_logits, topk

DEV, PAGE, K, LAYERS = "cuda", 64, 2048, 3
OUT = os.environ.get("OUT", ".")
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), rows=[])


def log(**f):
    R["rows"].append(f)
    print(json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(OUT, "l2_layers2.json"), "w"), indent=1)


SETASIDE = min(MAX_PERSIST, L2 * int(os.environ.get("SIXTEENTHS", "3")) // 16)


def setaside(on: bool) -> int:
    return set_persisting(SETASIDE if on else 0)


def main():
    pages = 65536 + 64
    key_pools, kv_pools, weights = [], [], []
    for _ in range(LAYERS):
        p = torch.empty(pages, PAGE * 132, dtype=torch.uint8, device=DEV)
        p[:, : PAGE * 128] = torch.randn(pages, PAGE * 128, device=DEV).to(torch.float8_e4m3fn).view(torch.uint8)
        p[:, PAGE * 128:] = (torch.rand(pages, PAGE, device=DEV) * 0.02 + 0.01).view(torch.uint8)
        key_pools.append(p)
        kv = torch.zeros(pages * PAGE, 656, dtype=torch.uint8, device=DEV)
        for s in range(0, kv.shape[0], 1 << 18):
            e = min(kv.shape[0], s + (1 << 18))
            dispatch.store_mla_kv(kv, torch.randn(e - s, 512, device=DEV), torch.randn(e - s, 64, device=DEV),
                                  torch.arange(s, e, device=DEV))
        kv_pools.append(kv)
        weights.append(torch.randn(7168, 16384, device=DEV, dtype=torch.bfloat16) * 0.01)
    for batch, ctx, next_n in [(32, 32768, 1), (128, 32768, 1), (32, 131072, 1), (32, 32768, 2), (64, 32768, 2)]:
        per = math.ceil(ctx / PAGE)
        n = batch * next_n
        tables = [torch.randperm(pages, device=DEV)[: batch * per].view(batch, per).int() for _ in range(LAYERS)]
        seq = torch.full((batch,), ctx, device=DEV)
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
        w = torch.randn(n, 64, device=DEV) * 0.1
        q_mla = torch.randn(n, 128, 576, device=DEV).to(torch.bfloat16)
        x = torch.randn(n, 7168, device=DEV, dtype=torch.bfloat16)

        def logits(layer):
            return indexer_logits.paged_indexer_logits(q, w, key_pools[layer], tables[layer], lens, PAGE, ctx, next_n,
                                                       clean_logits=False)

        def pick(layer, lg):
            return topk.topk_transform(lg, lens, K, topk.TRANSFORM_PAGED, block_table=tables[layer], page_size=PAGE,
                                       next_n=next_n)
        slots0 = pick(0, logits(0))

        def layers():
            lg = None
            for layer in range(LAYERS):
                lg = None
                lg = logits(layer)
                dispatch.sparse_mla_decode(q_mla, kv_pools[layer], pick(layer, lg), 576**-0.5)
                x @ weights[layer]
            return lg

        def indexers():
            lg = None
            for layer in range(LAYERS):
                lg = None
                lg = logits(layer)
            return lg

        def pairs():
            for layer in range(LAYERS):
                out = pick(layer, logits(layer))
            return out

        def mla():
            for layer in range(LAYERS):
                out, _ = dispatch.sparse_mla_decode(q_mla, kv_pools[layer], slots0, 576**-0.5)
            return out

        def copy():
            for layer in range(LAYERS):
                kv_pools[layer][: 1 << 20].copy_(kv_pools[layer][1 << 20: 2 << 20])  # 688 MB each way
            return kv_pools[0]

        def gemm():
            for layer in range(LAYERS):
                out = x @ weights[layer]
            return out
        layers()  # FlashMLA's schedule before any capture
        torch.cuda.synchronize()
        fns = dict(layers=layers, indexers=indexers, pairs=pairs, mla=mla, gemm=gemm, copy=copy)
        runs = [(name, on) for name in fns for on in (False, True)]
        for r in range(3):
            for name, on in (runs if r % 2 == 0 else runs[::-1]):
                limit = setaside(on)
                us, info = graph_us(fns[name], False)
                log(batch=batch, ctx=ctx, next_n=next_n, what=name, setaside=limit, round=r,
                    us_per_layer=round(us / LAYERS, 2), addrs=info["addrs"])
        setaside(False)


if __name__ == "__main__":
    main()

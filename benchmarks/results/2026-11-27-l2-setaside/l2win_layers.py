"""Does pinning the indexer's logits in L2 pay in a model's layer, where sparse MLA and a weight
GEMM run between two indexers? L layers of: our indexer (next_n 1, keys of the layer's own pool)
-> top-k (paged) -> sparse MLA decode (FP8, 128 heads, default dispatch) -> a bf16 GEMM streaming
235 MB of weights; one CUDA graph, with / without the persisting window on its kernel nodes.
source .device/setup.sh && python3 benchmarks/results/2026-11-27-l2-setaside/l2win_layers.py"""
import json, math, os, sys, time
sys.path.insert(0, "benchmarks/results/2026-11-27-l2-setaside")
import torch
from l2win_nextn import graph_us
from dsa_kernels import dispatch, indexer_logits, topk

DEV, PAGE, K, LAYERS = "cuda", 64, 2048, 3
OUT = os.environ.get("OUT", ".")
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), rows=[])


def log(**f):
    R["rows"].append(f)
    print(json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(OUT, "l2win_layers.json"), "w"), indent=1)


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
    for batch, ctx in [(32, 32768), (128, 32768), (32, 131072)]:
        per = math.ceil(ctx / PAGE)
        tables = [torch.randperm(pages, device=DEV)[: batch * per].view(batch, per).int() for _ in range(LAYERS)]
        lens = torch.full((batch,), ctx, device=DEV, dtype=torch.int32)
        q = torch.randn(batch, 64, 128, device=DEV).to(torch.float8_e4m3fn)
        w = torch.randn(batch, 64, device=DEV) * 0.1
        q_mla = torch.randn(batch, 128, 576, device=DEV).to(torch.bfloat16)
        x = torch.randn(batch, 7168, device=DEV, dtype=torch.bfloat16)

        def logits(layer):
            return indexer_logits.paged_indexer_logits(q, w, key_pools[layer], tables[layer], lens, PAGE, ctx, 1,
                                                       clean_logits=False)

        def step():
            last = None
            for layer in range(LAYERS):
                lg = logits(layer)
                slots = topk.topk_transform(lg, lens, K, topk.TRANSFORM_PAGED, block_table=tables[layer], page_size=PAGE)
                del lg
                o, _ = dispatch.sparse_mla_decode(q_mla, kv_pools[layer], slots, 576**-0.5)
                last = x @ weights[layer]
            return last

        def indexers():  # the logits' address is what the window needs: return the last layer's
            lg = None
            for layer in range(LAYERS):
                lg = None  # freed first, so every layer's logits take one address
                lg = logits(layer)
            return lg

        def step_logits():  # as step, returning a logits tensor for the window's address
            lg = None
            for layer in range(LAYERS):
                lg = None
                lg = logits(layer)
                slots = topk.topk_transform(lg, lens, K, topk.TRANSFORM_PAGED, block_table=tables[layer], page_size=PAGE)
                o, _ = dispatch.sparse_mla_decode(q_mla, kv_pools[layer], slots, 576**-0.5)
                x @ weights[layer]
            return lg
        step()  # FlashMLA's schedule before any capture
        torch.cuda.synchronize()
        runs = [("layers", False), ("layers", True), ("indexers", False), ("indexers", True)]
        fns = {"layers": step_logits, "indexers": indexers}
        for r in range(3):
            for name, wdw in (runs if r % 2 == 0 else runs[::-1]):
                us, info = graph_us(fns[name], wdw)
                log(batch=batch, ctx=ctx, what=name, window=wdw, round=r, us_per_layer=round(us / LAYERS, 2), **info)


if __name__ == "__main__":
    main()

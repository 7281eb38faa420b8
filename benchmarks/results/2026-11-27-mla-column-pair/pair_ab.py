"""EXPERIMENT: FP8 sparse MLA at 128 heads as CTA pairs (kernels/cta_pair.py, _gather_fp8_pair), split 1:
exactness against the one-CTA kernel, then alternating CUDA-graph replays, best of three, FlashMLA beside."""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import cta_pair, dispatch, sparse_mla, sparse_mla_gluon as G

PAIR = [False]
OFFSETS = {}
orig = G.launch


def launch(q, views, stride_kv, num_slots, indices, topk, part, part_lse, out, lse, scale_log2, keys_per_split, split,
           fp8, merge):
    if not PAIR[0]:
        return orig(q, views, stride_kv, num_slots, indices, topk, part, part_lse, out, lse, scale_log2, keys_per_split,
                    split, fp8, merge)
    assert split == 1 and fp8 and q.shape[1] == 128
    n, heads, _ = q.shape
    args = [q, q.stride(0), q.stride(1), *views, stride_kv, num_slots, indices, indices.stride(0), topk, part, part_lse,
            scale_log2, keys_per_split, split, part, part, part_lse]
    consts = dict(H=heads, FP8=True, PARTIAL=False, MERGE=0, num_warps=G.NUM_WARPS, PAIR=True)
    if "at" not in OFFSETS:
        probe = G._sparse_mla_kernel.run(*args, grid=(n * 2,), warmup=True, **consts, READY_AT=0, FREE_AT=0)
        print(probe.metadata.shared, flush=True)
        at = cta_pair.mbarrier_offsets(probe.asm["ptx"])
        print('inits', at); assert len(at) == 9, at
        OFFSETS["at"] = at
        print("mbarriers at", at, "shared", probe.metadata.shared, flush=True)
    at = OFFSETS["at"]
    k = cta_pair.launch_pairs(G._sparse_mla_kernel, n * 2, args, dict(consts, READY_AT=at[0], FREE_AT=at[2]))
    if "checked" not in OFFSETS:
        assert cta_pair.mbarrier_offsets(k.asm["ptx"]) == at
        OFFSETS["checked"] = True
    return False


G.launch = launch
SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))


def paired(fn):
    def run():
        PAIR[0] = True
        try:
            return fn()
        finally:
            PAIR[0] = False
    return run


rows = []
for n in (64, 128, 100):
    q = torch.randn(n, 128, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    idx[0, 1000:] = -1
    idx[1, :] = -1
    one = lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE)
    fns = dict(one_cta=one, pair=paired(one), flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
    assert sparse_mla.mla_config(n, 128, 2048)["SPLIT"] == 1, n
    a, la = one()
    a, la = a.clone(), la.clone()
    b, lb = fns["pair"]()
    torch.cuda.synchronize()
    r = dict(heads=128, n=n, equal=bool(torch.equal(a, b) and torch.equal(la, lb)),
             max_diff=float((a.float() - b.float()).abs().max()))
    print(json.dumps(r), flush=True)
    if not r["equal"] and os.environ.get("PAIR_EXCHANGE", "1") == "1":
        rows.append(r)
        break
    for i in range(3):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            r.setdefault(name, []).append(round(graph_ms(fns[name]) * 1e3, 2))
    best = {k: min(r[k]) for k in fns}
    r.update(pair_speedup=round(best["one_cta"] / best["pair"], 3), pair_vs_fm=round(best["flashmla"] / best["pair"], 3),
             one_vs_fm=round(best["flashmla"] / best["one_cta"], 3))
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "pair_ab_x%s.json" % os.environ.get("PAIR_EXCHANGE", "1")), "w"), indent=1)

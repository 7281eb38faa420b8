"""Where the meeting's time goes: the split op timed four ways in CUDA graphs (alternating, best
of three), FP8 pool, top-k 2048: `meet` (the working tree: cooperative launch, splits meet and
merge), `meet_plain` (the same kernel launched without the cooperative flag), `coop_merge_kernel`
(no meeting, cooperative launch, then the merge kernel), `plain` (no meeting, plain launch, merge
kernel: the committed path). Writes $OUT/$AB_NAME."""
import functools, json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, grid_barrier, sparse_mla, sparse_mla_gluon as g

SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
views = (pool.view(torch.float8_e4m3fn), pool.view(torch.float32), pool.view(torch.bfloat16))


def op(q, idx, meet, coop):
    n, heads, _ = q.shape
    split = sparse_mla.mla_config(n, heads, 2048)["SPLIT"]
    kps = 2048 // split
    out = torch.empty(n, heads, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(n, heads, device="cuda", dtype=torch.float32)
    part = torch.empty(n, split, heads, 512, device="cuda", dtype=torch.float32)
    part_lse = torch.empty(n, split, heads, device="cuda", dtype=torch.float32)
    grid = n * split * heads // 64
    run = functools.partial(g._sparse_mla_kernel[(grid,)], q, q.stride(0), q.stride(1), *views, 656, SLOTS, idx,
                            idx.stride(0), 2048, part, part_lse, SCALE * 1.4426950408889634, kps, split,
                            H=heads, FP8=True, PARTIAL=True, num_warps=4)
    opts = dict(launch_cooperative_grid=True) if coop else {}
    if meet:
        counters = grid_barrier.counters(q.device, n * heads // 64, "diag", "nothing")
        run(counters, out, lse, MERGE=split, **opts)
    else:
        run(part, part, part_lse, MERGE=0, **opts)
        m = sparse_mla.merge_config(split)
        sparse_mla._merge_splits_kernel[(n * heads * (512 // m["BLOCK_D"]),)](
            part, part_lse, out, lse, split, H=heads, SPLITS=split, **m)
    return out


rows = []
for heads, n in ((128, 32), (128, 16), (64, 16), (128, 1)):
    q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    fns = dict(meet=lambda: op(q, idx, True, True), meet_plain=lambda: op(q, idx, True, False),
               coop_merge_kernel=lambda: op(q, idx, False, True), plain=lambda: op(q, idx, False, False),
               flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
    ref = fns["plain"]()
    r = dict(heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
             maxdiff={k: float((fns[k]().float() - ref.float()).abs().max()) for k in ("meet", "meet_plain", "coop_merge_kernel")})
    for _ in range(3):
        for name, fn in fns.items():
            r.setdefault(name, []).append(round(graph_ms(fn) * 1e3, 2))
    r["best"] = {k: min(v) for k, v in r.items() if isinstance(v, list)}
    rows.append(r)
    print(json.dumps(r), flush=True)
    json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
              open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("AB_NAME", "meet_diag.json")), "w"), indent=1)

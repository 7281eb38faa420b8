"""next_n 4 on the Gluon kernel: the committed program of four tokens against a request's tokens in
two programs of two (next_n 2's config at 2 * batch requests) and in four programs of one; next_n 1
for the cost. CUDA graphs, alternating, best of three; logits compared bit for bit."""
import json, os, sys
import torch
sys.path.insert(0, "benchmarks")
from graph_timing import alternating_us
from dsa_kernels import indexer_gluon, indexer_logits

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = [(32, 4096), (128, 4096), (32, 32768), (64, 32768), (128, 32768), (32, 131072), (128, 131072)]
pool = torch.empty(128 * 131072 // PAGE + 64, PAGE * 132, dtype=torch.uint8, device="cuda")
for s in range(0, pool.shape[0], 4096):
    e = min(pool.shape[0], s + 4096)
    pool[s:e, : PAGE * 128] = torch.randn(e - s, PAGE * 128, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    pool[s:e, PAGE * 128:] = (torch.rand(e - s, PAGE, device="cuda") * 0.02 + 0.01).view(torch.uint8)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
rows = []
for batch, ctx in SHAPES:
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    seq = torch.full((batch,), ctx, device="cuda")
    fns, data = {}, {}
    for next_n in (1, 4):
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        q = torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch * next_n, 64, device="cuda") * 0.1
        data[next_n] = (q, w, lens)
    q1, w1, l1 = data[1]
    fns["n1"] = lambda: indexer_logits.paged_indexer_logits(q1, w1, pool, table, l1, PAGE, ctx, 1, clean_logits=False)
    q, w, lens = data[4]
    fns["n4"] = lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, 4, clean_logits=False)
    cfgs = {per: dict(indexer_gluon.gluon_config(batch * 4 // per, ctx, per, SMS), TOKENS_A_PROGRAM=per) for per in (2, 1)}
    for per, cfg in cfgs.items():
        fns[f"n4_{per}"] = (lambda cfg=cfg: indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, 4,
                                                                               False, cfg))
    inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
    want = fns["n4"]()
    same = {k: bool(torch.equal(fns[k]()[inside], want[inside])) for k in ("n4_2", "n4_1")}
    t = alternating_us(fns, rounds=3, rep_ms=15)
    best = {k: min(v) for k, v in t.items()}
    row = dict(batch=batch, ctx=ctx, us=best, all=t, same=same, cfgs={k: v for k, v in cfgs.items()},
               default=indexer_gluon.gluon_config(batch, ctx, 4, SMS),
               cost={k: round(v / best["n1"], 3) for k, v in best.items()},
               speed_over_default={k: round(best["n4"] / best[k], 3) for k in ("n4_2", "n4_1")})
    print(json.dumps({k: row[k] for k in ("batch", "ctx", "us", "same", "cost", "speed_over_default")}), flush=True)
    rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "pairs4_ab.json"), "w"), indent=1)

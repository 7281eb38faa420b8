"""next_n 3 on small grids:
the new default path against the old config (programs of four tokens, the same chunk rule), keys
read from HBM (block tables rotated past 3x L2) and from L2 (one table replayed); next_n 1 for
the cost. CUDA graphs, alternating, best of three; bit equality."""
import itertools, json, math, os, sys
import torch
sys.path.insert(0, "benchmarks")
from graph_timing import alternating_us
from indexer_bench import random_index_pool
from dsa_kernels import indexer_gluon, indexer_logits
from dsa_kernels.device import l2_bytes

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = [(1, 4096), (1, 32768), (2, 8192), (4, 8192), (8, 4096), (16, 4096), (32, 4096), (64, 4096), (2, 32768),
          (8, 32768), (2, 131072), (128, 4096)]
pool = random_index_pool(3 * 64 * 131072 // PAGE, PAGE)
keys, scales = indexer_logits.pool_parts(pool, PAGE)


def old_config(batch, ctx):  # here: programs of two tokens (the last repeating token 1)
    return dict(indexer_gluon.gluon_config(2 * batch, ctx, 2, SMS), TOKENS_A_PROGRAM=2)


rows = []
for batch, ctx in SHAPES:
    seq = torch.full((batch,), ctx, device="cuda")
    data = {}
    for next_n in (1, 3):
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        data[next_n] = (torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn),
                        torch.randn(batch * next_n, 64, device="cuda") * 0.1, lens)
    q1, w1, l1 = data[1]
    q, w, lens = data[3]
    old = old_config(batch, ctx)
    calls = {
        "n1": lambda t: indexer_logits.paged_indexer_logits(q1, w1, pool, t, l1, PAGE, ctx, 1, clean_logits=False),
        "n4": lambda t: indexer_logits.paged_indexer_logits(q, w, pool, t, lens, PAGE, ctx, 3, clean_logits=False),
        "n4_old": lambda t: indexer_gluon.paged_indexer_logits(q, w, keys, scales, t, lens, ctx, 3, False, old),
    }
    pages = batch * ctx // PAGE
    rotation = max(2, math.ceil(3 * l2_bytes(pool.device) / (pages * PAGE * 132)))
    tables = torch.randperm(pool.shape[0], device="cuda")[: rotation * pages].view(rotation, batch, -1).int()
    inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
    same = bool(torch.equal(calls["n4"](tables[0])[inside], calls["n4_old"](tables[0])[inside]))
    fns = {}
    for k, c in calls.items():
        turns = itertools.cycle(list(tables))
        fns[k + "_hbm"] = (lambda c=c, turns=turns: c(next(turns)))
        fns[k + "_l2"] = (lambda c=c: c(tables[0]))
    t = alternating_us(fns, rounds=2, rep_ms=8)
    best = {k: min(v) for k, v in t.items()}
    row = dict(batch=batch, ctx=ctx, us=best, all=t, same=same, new=indexer_gluon.gluon_config(batch, ctx, 3, SMS),
               old=old, speed={m: round(best[f"n4_old_{m}"] / best[f"n4_{m}"], 3) for m in ("hbm", "l2")},
               cost={m: {"new": round(best[f"n4_{m}"] / best[f"n1_{m}"], 3),
                         "old": round(best[f"n4_old_{m}"] / best[f"n1_{m}"], 3)} for m in ("hbm", "l2")})
    print(json.dumps({k: row[k] for k in ("batch", "ctx", "same", "speed", "cost")}), flush=True)
    rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "small3_check.json"), "w"), indent=1)

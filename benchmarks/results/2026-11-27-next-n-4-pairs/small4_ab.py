"""next_n 4 on small grids, keys read from HBM (block tables rotated past 3x L2, as bench_kernels'
from_hbm): the default program of four tokens against two programs of two (next_n 2's config at
2 x batch requests); next_n 1 for the cost. CUDA graphs, alternating, best of three; bit equality."""
import itertools, json, math, os, sys
import torch
sys.path.insert(0, "benchmarks")
from graph_timing import alternating_us
from indexer_bench import random_index_pool
from dsa_kernels import indexer_gluon, indexer_logits
from dsa_kernels.device import l2_bytes

PAGE, SMS = 64, torch.cuda.get_device_properties(0).multi_processor_count
SHAPES = [(4, 8192), (8, 4096), (8, 8192), (16, 4096), (16, 8192), (24, 4096), (32, 4096), (48, 4096), (64, 4096),
          (96, 4096), (2, 32768), (4, 32768), (8, 32768), (1, 131072), (2, 131072)]
pool = random_index_pool(3 * 64 * 131072 // PAGE, PAGE)
keys, scales = indexer_logits.pool_parts(pool, PAGE)


def rotated(call, batch, ctx):
    pages = batch * ctx // PAGE
    rotation = max(2, math.ceil(3 * l2_bytes(pool.device) / (pages * PAGE * 132)))
    tables = torch.randperm(pool.shape[0], device="cuda")[: rotation * pages].view(rotation, batch, -1).int()
    turns = itertools.cycle(list(tables))
    return lambda: call(next(turns)), tables[0]


rows = []
for batch, ctx in SHAPES:
    seq = torch.full((batch,), ctx, device="cuda")
    data = {}
    for next_n in (1, 4):
        lens = torch.stack([seq - next_n + j + 1 for j in range(next_n)], 1).reshape(-1).int()
        data[next_n] = (torch.randn(batch * next_n, 64, 128, device="cuda").to(torch.float8_e4m3fn),
                        torch.randn(batch * next_n, 64, device="cuda") * 0.1, lens)
    q1, w1, l1 = data[1]
    q, w, lens = data[4]
    pairs = dict(indexer_gluon.gluon_config(batch * 2, ctx, 2, SMS), TOKENS_A_PROGRAM=2)
    calls = {
        "n1": lambda t: indexer_logits.paged_indexer_logits(q1, w1, pool, t, l1, PAGE, ctx, 1, clean_logits=False),
        "n4": lambda t: indexer_logits.paged_indexer_logits(q, w, pool, t, lens, PAGE, ctx, 4, clean_logits=False),
        "n4_pairs": lambda t: indexer_gluon.paged_indexer_logits(q, w, keys, scales, t, lens, ctx, 4, False, pairs),
    }
    fns, table = {}, None
    for k, c in calls.items():
        fns[k], table = rotated(c, batch, ctx)
    inside = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
    same = bool(torch.equal(calls["n4"](table)[inside], calls["n4_pairs"](table)[inside]))
    t = alternating_us(fns, rounds=3, rep_ms=10)
    best = {k: min(v) for k, v in t.items()}
    default = indexer_gluon.gluon_config(batch, ctx, 4, SMS)
    row = dict(batch=batch, ctx=ctx, us=best, all=t, same=same, default=default, pairs=pairs,
               programs_default=batch * math.ceil(ctx / default["KEYS_PER_PROG"]),
               programs_pairs=2 * batch * math.ceil(ctx / pairs["KEYS_PER_PROG"]),
               cost={k: round(v / best["n1"], 3) for k, v in best.items()},
               pairs_speed=round(best["n4"] / best["n4_pairs"], 3))
    print(json.dumps({k: row[k] for k in ("batch", "ctx", "us", "same", "cost", "pairs_speed", "programs_default",
                                          "programs_pairs")}), flush=True)
    rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "small4_ab.json"), "w"), indent=1)

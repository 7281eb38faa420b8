"""next_n 4 at 32 heads: the few-heads rule (gluon_config(..., heads=32)) against the 64-head rule's
config, CUDA graphs, three alternating rounds; logits compared bit for bit."""
import json, os, sys
sys.path.insert(0, "benchmarks")
import torch
from dsa_kernels import indexer_gluon, indexer_logits
from graph_timing import graph_ms
from indexer_bench import random_index_pool

PAGE, H, N = 64, 32, 4
sms = torch.cuda.get_device_properties(0).multi_processor_count
out = dict(gpu=torch.cuda.get_device_name(0), heads=H, next_n=N, rows=[])
pool = random_index_pool(160 * 32768 // PAGE + 64, PAGE)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
# SHAPES=ROWSxKEYS,... compares other grids (the forty-third session's mid grids)
SHAPES = [tuple(map(int, x.split("x"))) for x in os.environ.get("SHAPES", "32x32768,128x4096,20x32768,24x32768,100x4096,160x4096").split(",")]
for batch, ctx in SHAPES:
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    lens = torch.stack([torch.full((batch,), ctx - N + j + 1, device="cuda") for j in range(N)], 1).reshape(-1).int()
    q = torch.randn(batch * N, H, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch * N, H, device="cuda") * 0.1
    cfgs = {"new": indexer_gluon.gluon_config(batch, ctx, N, sms, H), "old": indexer_gluon.gluon_config(batch, ctx, N, sms)}
    run = lambda c: indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, N, False, c)
    vis = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
    equal = torch.equal(torch.where(vis, run(cfgs["new"]), 0.0), torch.where(vis, run(cfgs["old"]), 0.0))
    t = {k: [] for k in cfgs}
    for r in range(3):
        for k in (("new", "old") if r % 2 == 0 else ("old", "new")):
            t[k].append(graph_ms(lambda: run(cfgs[k])) * 1e3)
    row = dict(batch=batch, ctx=ctx, cfgs=cfgs, equal=equal, us={k: [round(x, 2) for x in v] for k, v in t.items()},
               speedup=round(min(t["old"]) / min(t["new"]), 3))
    out["rows"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(out, open(os.environ.get("OUT", ".") + "/ab32.json", "w"), indent=1)

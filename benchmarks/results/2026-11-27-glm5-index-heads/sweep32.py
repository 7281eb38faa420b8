"""Gluon paged indexer configs at 32 heads (GLM-5) against the default (the 64-head rule), CUDA graphs,
next_n 1 / 2 / 4 at the large grids, two alternating rounds; every config's logits checked equal."""
import itertools, json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from dsa_kernels import indexer_gluon, indexer_logits
from graph_timing import graph_ms
from indexer_bench import random_index_pool

PAGE, H = 64, int(os.environ.get("HEADS", "32"))
sms = torch.cuda.get_device_properties(0).multi_processor_count
out = dict(gpu=torch.cuda.get_device_name(0), heads=H, rows=[])
pool = random_index_pool(128 * 32768 // PAGE + 64, PAGE)
keys, scales = indexer_logits.pool_parts(pool, PAGE)
t0 = time.time()
# SHAPES=ROWSxKEYS,... and NEXT_NS=4,... sweep other grids (the forty-third session's mid grids)
SHAPES = [tuple(map(int, x.split("x"))) for x in os.environ.get("SHAPES", "32x32768,128x32768,128x4096,32x4096").split(",")]
for (batch, ctx), next_n in itertools.product(SHAPES, [int(x) for x in os.environ.get("NEXT_NS", "2,4").split(",")]):
    table = torch.randperm(pool.shape[0], device="cuda")[: batch * ctx // PAGE].view(batch, -1).int()
    lens = torch.stack([torch.full((batch,), ctx - next_n + j + 1, device="cuda") for j in range(next_n)], 1).reshape(-1).int()
    q = torch.randn(batch * next_n, H, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, H, device="cuda") * 0.1
    default = indexer_gluon.gluon_config(batch, ctx, next_n, sms)
    cfgs = [default]
    for kpp, stages, overlap, unrolled, tap in itertools.product((512, 1024, 2048), (2, 3, 4), (True, False), (False, True),
                                                            (next_n,) if next_n == 2 else (4, 2)):
        if unrolled and (overlap or (kpp // 64) % stages):
            continue
        c = dict(KEYS_PER_PROG=kpp, STAGES=stages, OVERLAP=overlap, UNROLLED=unrolled)
        if tap != next_n:
            c["TOKENS_A_PROGRAM"] = tap
        cfgs.append(c)
    run = lambda c: indexer_gluon.paged_indexer_logits(q, w, keys, scales, table, lens, ctx, next_n, False, c)
    want = run(default)
    vis = torch.arange(ctx, device="cuda")[None, :] < lens[:, None]
    times = {}
    for r in range(2):
        for i, c in enumerate(cfgs if r == 0 else cfgs[::-1]):
            key = json.dumps(c, sort_keys=True)
            try:
                if r == 0 and not torch.equal(torch.where(vis, run(c), 0.0), torch.where(vis, want, 0.0)):
                    times[key] = None; continue
                if times.get(key, 0) is None: continue
                t = graph_ms(lambda: run(c), rep_ms=15, replays=5)
                times[key] = min(times.get(key, 1e9), t)
            except Exception as exc:
                times[key] = None
    dkey = json.dumps(default, sort_keys=True)
    ranked = sorted((t, k) for k, t in times.items() if t)
    row = dict(batch=batch, ctx=ctx, next_n=next_n, default=default, default_us=round(times[dkey] * 1e3, 2),
               best=[(round(t * 1e3, 2), k) for t, k in ranked[:4]], wrong=[k for k, t in times.items() if t is None])
    out["rows"].append(row)
    print(json.dumps(row), f"{time.time() - t0:.0f}s", flush=True)
    json.dump(out, open(os.environ.get("OUT", ".") + "/sweep32.json", "w"), indent=1)

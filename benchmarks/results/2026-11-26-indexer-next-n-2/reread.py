"""Why 128 / 32K next_n 2 read 154 us in bench_kernels' indexer section and 173 us in sc_ab.py."""
import json, os, sys, time
sys.argv = [sys.argv[0], "--budget", "1"]
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from dsa_kernels import dispatch, indexer_gluon, indexer_logits
PAGE = bk.PAGE
SMS = torch.cuda.get_device_properties(0).multi_processor_count
pool = bk.index_pool(128 * 131072 // PAGE + 64)
parts = indexer_logits.pool_parts(pool, PAGE)
res = []
for batch, ctx in ((128, 32768), (32, 131072)):
    for next_n in (1, 2):
        q, w, table, lens = bk.paged_case(batch, ctx, next_n, pool)
        cfg = indexer_gluon.gluon_config(batch, ctx, next_n, SMS)
        fns = dict(
            direct=lambda: indexer_gluon.paged_indexer_logits(q, w, *parts, table, lens, ctx, next_n, False, cfg),
            default=lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False),
            deepgemm=lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, False))
        row = dict(batch=batch, ctx=ctx, next_n=next_n)
        for rep in range(3):
            for name, fn in fns.items():
                row.setdefault(name, []).append(round(bk.bench_graph(fn) * 1e3, 1))
        # what bench_kernels does before its default-path row: the Triton kernel timed without a graph
        for c in bk.PAGED_CONFIGS[:3]:
            bk.bench(lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, next_n, clean_logits=False, config=c))
        for name, fn in fns.items():
            row.setdefault(name + "_after_triton", []).append(round(bk.bench_graph(fn) * 1e3, 1))
        print(json.dumps(row), flush=True)
        res.append(row)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "disc.json"), "w"), indent=1)

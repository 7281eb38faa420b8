"""next_n 4 as next_n-2 program pairs: the Gluon paged indexer run at next_n 2 over 2x the requests, each
request's block-table row repeated, so programs (2 r, c) and (2 r + 1, c) read the same keys side by side
(the second from L2). Against next_n 4 native and next_n 1.  python3 benchmarks/results/2026-11-25-indexer-next-n-pairs/nn4_ab.py (nineteenth session)"""
import json, os, sys, time
sys.argv = [sys.argv[0], "--budget", "1"]
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from dsa_kernels import indexer_logits

OUT = os.environ.get("OUT", "/tmp")
PAGE = bk.PAGE
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=[])
pool = bk.index_pool(128 * 131072 // PAGE + 64)
for batch, ctx in ((32, 4096), (128, 4096), (32, 32768), (128, 32768), (32, 131072), (128, 131072)):
    row = dict(batch=batch, ctx=ctx)
    q1, w1, t1, l1 = bk.paged_case(batch, ctx, 1, pool)
    q, w, table, lens = bk.paged_case(batch, ctx, 4, pool)
    table2 = table.repeat_interleave(2, 0)
    f1 = lambda: indexer_logits.paged_indexer_logits(q1, w1, pool, t1, l1, PAGE, ctx, 1, clean_logits=False)
    f4 = lambda: indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, ctx, 4, clean_logits=False)
    fp = lambda: indexer_logits.paged_indexer_logits(q, w, pool, table2, lens, PAGE, ctx, 2, clean_logits=False)
    fpr = lambda: indexer_logits.paged_indexer_logits(q, w, pool, table.repeat_interleave(2, 0), lens, PAGE, ctx, 2,
                                                      clean_logits=False)
    row["equal"] = bool(torch.equal(f4(), fp()))
    row["gluon_n2"] = indexer_logits.gluon_paged_config(q.device, 2 * batch, ctx, 2, PAGE)
    for _ in range(2):
        for name, fn in (("n1", f1), ("n4", f4), ("pairs", fp), ("pairs_with_repeat", fpr)):
            row.setdefault(name + "_us", []).append(round(bk.bench_graph(fn) * 1e3, 2))
    n1 = min(row["n1_us"])
    row["n4_cost"] = round(min(row["n4_us"]) / n1, 3)
    row["pairs_cost"] = round(min(row["pairs_us"]) / n1, 3)
    row["pairs_with_repeat_cost"] = round(min(row["pairs_with_repeat_us"]) / n1, 3)
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "nn4_ab.json"), "w") as f:
        json.dump(res, f, indent=1)

"""One launch each, inside a profiler range, of DeepGEMM's and our paged indexer at batch 128 / 32K,
next_n 1 and 2 (ours: base and the one-MMA-at-a-time variant)."""
import sys
sys.argv = [sys.argv[0], "--budget", "1"]
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from dsa_kernels import dispatch, indexer_gluon, indexer_logits

PAGE, CTX, B = bk.PAGE, 32768, 128
SMS = torch.cuda.get_device_properties(0).multi_processor_count
pool = bk.index_pool(B * CTX // PAGE + 64)
parts = indexer_logits.pool_parts(pool, PAGE)
calls = []
for next_n in (1, 2):
    q, w, table, lens = bk.paged_case(B, CTX, next_n, pool)
    cfg = dict(indexer_gluon.gluon_config(B, CTX, next_n, SMS), OVERLAP=True, STAGES=4)
    calls.append((f"dg{next_n}", lambda q=q, w=w, t=table, l=lens, n=next_n: dispatch._deepgemm_paged(q, w, pool, t, l, PAGE, CTX, n, False)))
    calls.append((f"ours{next_n}", lambda q=q, w=w, t=table, l=lens, n=next_n, c=cfg: indexer_gluon.paged_indexer_logits(q, w, *parts, t, l, CTX, n, False, c)))
    if next_n == 2:
        c2 = dict(cfg, OVERLAP=False, STAGES=3)
        calls.append(("sync2", lambda q=q, w=w, t=table, l=lens, c=c2: indexer_gluon.paged_indexer_logits(q, w, *parts, t, l, CTX, 2, False, c)))
import os
only = os.environ.get("ONLY")
if only:
    calls = [c for c in calls if c[0] in only.split(",")]
for _, fn in calls:
    fn(); fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for name, fn in calls:
    print("launch", name, flush=True)
    fn()
    torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()

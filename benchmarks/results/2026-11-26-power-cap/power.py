"""SM clock, power and time of each workload replayed alone for ~2.5 s (CUDA graph of 10 calls):
energy per call = median power x time per call. Indexer (ours / DeepGEMM, next_n 1/2/4, and
the next_n 2 / 4 diagnostic variants), sparse MLA decode (ours / FlashMLA)."""
import json, os, subprocess, sys, time
sys.argv = [sys.argv[0], "--budget", "1"]
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from dsa_kernels import dispatch, indexer_gluon, indexer_logits, sparse_mla
import importlib.util
_spec = importlib.util.spec_from_file_location("dsa_kernels.ix_diag", ".ab/ix_diag.py")
diag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diag)
OUT = os.environ.get("OUT", "/tmp")
SMS = torch.cuda.get_device_properties(0).multi_processor_count
SECS = float(os.environ.get("SECS", "2.5"))
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=[])

def measure(name, fn, **tag):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay(); torch.cuda.synchronize()
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active,temperature.gpu",
                          "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, stop = 0, time.time() + SECS
    e0.record()
    while time.time() < stop:
        g.replay(); n += 10
        if n % 100 == 0:
            torch.cuda.synchronize()
    e1.record(); torch.cuda.synchronize()
    p.terminate(); out = p.communicate()[0]
    lines = [l.split(",") for l in out.strip().splitlines()]
    lines = lines[len(lines) // 5: -1] or lines  # drop the ramp
    med = lambda xs: sorted(xs)[len(xs) // 2]
    us = e0.elapsed_time(e1) * 1e3 / n
    watts = med([float(l[1]) for l in lines])
    r = dict(name=name, **tag, us=round(us, 2), sm_mhz=med([float(l[0]) for l in lines]),
             sm_mhz_min=min(float(l[0]) for l in lines), watts=watts, mj_per_call=round(us * watts * 1e-3, 1),
             temp_c=med([float(l[3]) for l in lines]), throttle=sorted({l[2].strip() for l in lines}))
    res["rows"].append(r)
    print(json.dumps(r), flush=True)
    json.dump(res, open(os.path.join(OUT, "power.json"), "w"), indent=1)

if "indexer" in os.environ.get("ONLY", "indexer,mla"):
    pool = bk.index_pool(128 * 32768 // bk.PAGE + 64)
    parts = indexer_logits.pool_parts(pool, bk.PAGE)
    for batch, ctx in ((128, 32768), (32, 131072)):
        for nn in (1, 2, 4):
            q, w, table, lens = bk.paged_case(batch, ctx, nn, pool)
            cfg = indexer_gluon.gluon_config(batch, ctx, nn, SMS)
            tag = dict(batch=batch, ctx=ctx, next_n=nn)
            measure("ours", lambda: indexer_gluon.paged_indexer_logits(q, w, *parts, table, lens, ctx, nn, False, cfg), **tag)
            if nn < 4:
                measure("deepgemm", lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, bk.PAGE, ctx, nn, False), **tag)
            if nn > 1 and batch == 128:
                for dname, extra in (("loads_only", dict(DIAG=3)), ("pure_mma", dict(DIAG=4)), ("mma_only", dict(DIAG=1)),
                                     ("score_only", dict(DIAG=2))):
                    c = {**cfg, **extra}
                    measure(dname, (lambda c: lambda: diag.paged_indexer_logits(q, w, *parts, table, lens, ctx, nn, False, c))(c), **tag)
    del pool, parts
if "mla" in os.environ.get("ONLY", "indexer,mla"):
    SLOTS = 262144
    for fp8 in (True, False):
        kv = torch.zeros(SLOTS, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
        dispatch.store_mla_kv(kv, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                              torch.arange(SLOTS, device="cuda"))
        for heads, n in ((128, 128), (128, 32), (64, 128)):
            if not fp8 and (heads, n) != (128, 128):
                continue
            q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
            tag = dict(heads=heads, batch=n, fp8=fp8)
            measure("ours_mla", lambda: sparse_mla.sparse_mla(q, kv, idx, 576**-0.5), **tag)
            if fp8:
                measure("flashmla", lambda: dispatch._flashmla_decode(q, kv, idx, 576**-0.5), **tag)
        del kv

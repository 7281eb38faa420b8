"""SM clock and power while each next_n 4 diagnostic variant runs alone for ~3 s (graph replays)."""
import json, os, subprocess, sys, threading, time
sys.argv = [sys.argv[0], "--budget", "1"]
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from dsa_kernels import indexer_gluon, indexer_logits
import importlib.util
_spec = importlib.util.spec_from_file_location("dsa_kernels.ix_diag", ".ab/ix_diag.py")
diag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diag)
OUT = os.environ.get("OUT", "/tmp")
SMS = torch.cuda.get_device_properties(0).multi_processor_count
pool = bk.index_pool(128 * 32768 // bk.PAGE + 64)
parts = indexer_logits.pool_parts(pool, bk.PAGE)
batch, ctx = 128, 32768
q1, w1, t1, l1 = bk.paged_case(batch, ctx, 1, pool)
q, w, table, lens = bk.paged_case(batch, ctx, 4, pool)
base = indexer_gluon.gluon_config(batch, ctx, 4, SMS)
cfg1 = indexer_gluon.gluon_config(batch, ctx, 1, SMS)
fns = {"nn1": lambda: indexer_gluon.paged_indexer_logits(q1, w1, *parts, t1, l1, ctx, 1, False, cfg1)}
for name, extra in [("base", {}), ("mma_only", dict(DIAG=1)), ("pure_mma", dict(DIAG=4)), ("score_only", dict(DIAG=2)),
                    ("loads_only", dict(DIAG=3))]:
    fns[name] = (lambda c: lambda: diag.paged_indexer_logits(q, w, *parts, table, lens, ctx, 4, False, c))({**base, **extra})
a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
one = torch.ones((), device="cuda")
fns["scaled_mm_8k"] = lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
res = dict(gpu=torch.cuda.get_device_name(), rows=[])
for name, fn in fns.items():
    g = torch.cuda.CUDAGraph()
    fn(); torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    g.replay(); torch.cuda.synchronize()
    samples = []
    stop = time.time() + 3.0
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active", "--format=csv,noheader,nounits",
                          "-lms", "100"], stdout=subprocess.PIPE, text=True)
    n = 0
    s0 = torch.cuda.Event(enable_timing=True); s1 = torch.cuda.Event(enable_timing=True)
    s0.record()
    while time.time() < stop:
        g.replay(); n += 20
        if n % 200 == 0:
            torch.cuda.synchronize()
    s1.record(); torch.cuda.synchronize()
    p.terminate(); out = p.communicate()[0]
    lines = [l.split(",") for l in out.strip().splitlines()[3:-1]]
    clocks = [float(l[0]) for l in lines]; power = [float(l[1]) for l in lines]
    r = dict(name=name, us_per_call=round(s0.elapsed_time(s1) * 1e3 / n, 2), sm_mhz_median=sorted(clocks)[len(clocks) // 2] if clocks else None,
             sm_mhz_min=min(clocks) if clocks else None, power_w_median=sorted(power)[len(power) // 2] if power else None,
             throttle=sorted({l[2].strip() for l in lines}))
    res["rows"].append(r)
    print(json.dumps(r), flush=True)
json.dump(res, open(os.path.join(OUT, "nn4_clocks.json"), "w"), indent=1)

"""Where the next_n 4 paged indexer's time goes (one-MMA schedule): loads only, loads + MMA
(scoring never run), loads + scoring (the first tile's products reused, no MMA in the loop), the
whole kernel; and one MMA unit of all four tokens (N = 256). CUDA graphs, alternating, best of 3."""
import json, os, sys, time
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
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=[])
pool = bk.index_pool(128 * 131072 // bk.PAGE + 64)
parts = indexer_logits.pool_parts(pool, bk.PAGE)
VARIANTS = [("mma_only", dict(DIAG=1)), ("pure_mma", dict(DIAG=4)), ("wide_mma_only", dict(WIDE=True, DIAG=1)),
            ("wide_pure_mma", dict(WIDE=True, DIAG=4)), ("mma_only_s3", dict(DIAG=1, STAGES=3))]
t0 = time.time()
for batch, ctx in ((128, 32768), (32, 131072)):
    q1, w1, table1, lens1 = bk.paged_case(batch, ctx, 1, pool)
    cfg1 = indexer_gluon.gluon_config(batch, ctx, 1, SMS)
    q, w, table, lens = bk.paged_case(batch, ctx, 4, pool)
    base = indexer_gluon.gluon_config(batch, ctx, 4, SMS)
    row = dict(batch=batch, ctx=ctx, base_cfg=base)
    run = lambda cfg, clean=False: diag.paged_indexer_logits(q, w, *parts, table, lens, ctx, 4, clean, cfg)
    want = indexer_gluon.paged_indexer_logits(q, w, *parts, table, lens, ctx, 4, True, base)
    row["diag_base_equal"] = bool(torch.equal(run(base, True), want))
    fns = {"nn1": lambda: indexer_gluon.paged_indexer_logits(q1, w1, *parts, table1, lens1, ctx, 1, False, cfg1),
           "base": lambda: indexer_gluon.paged_indexer_logits(q, w, *parts, table, lens, ctx, 4, False, base)}
    for name, extra in VARIANTS:
        cfg = {**base, **extra}
        try:
            got = run(cfg, True)
            if name.startswith("wide"):
                row[name + "_equal"] = bool(torch.equal(got, want))
            fns[name] = (lambda c: lambda: run(c))(cfg)
        except Exception as exc:  # noqa: BLE001
            row[name + "_error"] = str(exc)[-300:]
    for _ in range(3):
        for name, fn in fns.items():
            row.setdefault(name + "_us", []).append(round(bk.bench_graph(fn) * 1e3, 2))
    best = {k[:-3]: min(v) for k, v in row.items() if k.endswith("_us")}
    row["over_nn1"] = {k: round(v / best["nn1"], 3) for k, v in best.items()}
    row["s"] = round(time.time() - t0)
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "nn4_diag.json"), "w") as f:
        json.dump(res, f, indent=1)

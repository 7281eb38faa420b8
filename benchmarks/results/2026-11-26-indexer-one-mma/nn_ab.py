"""A/B of the Gluon paged indexer: MMA overlapped in each program (base) vs one MMA at a time with
more programs per SM (OVERLAP False, maxnreg). CUDA graphs, each variant twice in alternation,
outputs checked bit for bit against the base (clean logits)."""
import json, os, sys, time
sys.argv = [sys.argv[0], "--budget", "1"]
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from dsa_kernels import dispatch, indexer_gluon, indexer_logits
import importlib.util
_spec = importlib.util.spec_from_file_location("dsa_kernels.indexer_orig", ".ab/indexer_base.py")
orig = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(orig)

OUT = os.environ.get("OUT", "/tmp")
PAGE = bk.PAGE
SMS = torch.cuda.get_device_properties(0).multi_processor_count
only = [a for a in os.environ.get("SHAPES", "").split(",") if a]
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=[])
pool = bk.index_pool(128 * 131072 // PAGE + 64)
parts = indexer_logits.pool_parts(pool, PAGE)

def sync(**kw):
    return dict(OVERLAP=False, **kw)
VARIANTS = {1: [], 2: [("sync_s3", sync(STAGES=3)), ("sync_s3_4096", sync(STAGES=3, KEYS_PER_PROG=4096)),
                     ("sync_s3_8192", sync(STAGES=3, KEYS_PER_PROG=8192)), ("sync_s4_4096", sync(STAGES=4, KEYS_PER_PROG=4096)),
                     ("sync_s3_1024", sync(STAGES=3, KEYS_PER_PROG=1024))],
            4: [("sync_s2", sync(STAGES=2)), ("sync_s2_2048", sync(STAGES=2, KEYS_PER_PROG=2048)),
                ("sync_s3_2048", sync(STAGES=3, KEYS_PER_PROG=2048))]}
t0 = time.time()
for batch, ctx in ((32, 4096), (128, 4096), (32, 32768), (128, 32768), (32, 131072), (128, 131072)):
    if only and f"{batch}x{ctx}" not in only:
        continue
    for next_n in (1, 2, 4):
        q, w, table, lens = bk.paged_case(batch, ctx, next_n, pool)
        base_cfg = indexer_gluon.gluon_config(batch, ctx, next_n, SMS)
        if base_cfg is None:
            continue
        row_default = dict(base_cfg)
        base_cfg = dict(base_cfg, OVERLAP=True, STAGES=4)
        row = dict(batch=batch, ctx=ctx, next_n=next_n, default_cfg=row_default)
        run = lambda cfg, clean=False: indexer_gluon.paged_indexer_logits(q, w, *parts, table, lens, ctx, next_n, clean, cfg)
        want = run(base_cfg, True)
        orig_cfg = {k: v for k, v in base_cfg.items() if k != 'OVERLAP'}
        fns = {"base": lambda: run(base_cfg)}
        row["orig_equal"] = bool(torch.equal(orig.paged_indexer_logits(q, w, *parts, table, lens, ctx, next_n, True, orig_cfg), want))
        fns["orig"] = lambda: orig.paged_indexer_logits(q, w, *parts, table, lens, ctx, next_n, False, orig_cfg)
        for name, extra in VARIANTS[next_n]:
            cfg = {**base_cfg, **extra}
            try:
                got = run(cfg, True)
                row[name + "_equal"] = bool(torch.equal(got, want))
                fns[name] = (lambda c: lambda: run(c))(cfg)
            except Exception as exc:  # noqa: BLE001
                row[name + "_error"] = str(exc)[-300:]
        if next_n < 4:
            fns["deepgemm"] = lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, False)
        for _ in range(2):
            for name, fn in fns.items():
                try:
                    row.setdefault(name + "_us", []).append(round(bk.bench_graph(fn) * 1e3, 2))
                except Exception as exc:  # noqa: BLE001
                    row[name + "_error"] = str(exc)[-200:]
        best = {k[:-3]: min(v) for k, v in row.items() if k.endswith("_us")}
        row["speed_vs_base"] = {k: round(best["base"] / v, 3) for k, v in best.items()}
        row["s"] = round(time.time() - t0)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(OUT, "nn_ab.json"), "w") as f:
            json.dump(res, f, indent=1)

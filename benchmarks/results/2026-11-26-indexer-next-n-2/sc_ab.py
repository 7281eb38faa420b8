"""A/B of the Gluon paged indexer: the committed kernel (old, .ab/indexer_base.py) at gluon_config's
default vs kernels/indexer_gluon.py at that default updated by each of VARIANTS (JSON {name: cfg}).
CUDA graphs, alternating replays, outputs compared bit for bit (clean and unclean)."""
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

def _module(path):
    if path is None:
        return indexer_gluon
    spec = importlib.util.spec_from_file_location("dsa_kernels." + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


OUT = os.environ.get("OUT", "/tmp")
PAGE = bk.PAGE
SMS = torch.cuda.get_device_properties(0).multi_processor_count
VARIANTS = json.loads(os.environ.get("VARIANTS", '{"new": {}}'))
REPS = int(os.environ.get("REPS", "3"))
only = [a for a in os.environ.get("SHAPES", "").split(",") if a]
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=[])
pool = bk.index_pool(128 * 131072 // PAGE + 64)
parts = indexer_logits.pool_parts(pool, PAGE)
t0 = time.time()
for batch, ctx in ((32, 4096), (128, 4096), (32, 32768), (128, 32768), (32, 131072), (128, 131072)):
    if only and f"{batch}x{ctx}" not in only:
        continue
    for next_n in [int(n) for n in os.environ.get("NEXT_N", "1,2,4").split(",")]:
        q, w, table, lens = bk.paged_case(batch, ctx, next_n, pool)
        cfg = indexer_gluon.gluon_config(batch, ctx, next_n, SMS)
        cfg_old = orig.gluon_config(batch, ctx, next_n, SMS)
        if cfg is None:
            continue
        row = dict(batch=batch, ctx=ctx, next_n=next_n, cfg=cfg, cfg_old=cfg_old)
        old = lambda clean=False: orig.paged_indexer_logits(q, w, *parts, table, lens, ctx, next_n, clean, cfg_old)
        fns = {"old": old}
        want, want_unclean = old(True), old(False)
        valid = torch.arange(ctx, device=q.device)[None, :] < lens.reshape(-1, 1)
        for name, extra in VARIANTS.items():
            c = {**cfg, **extra}
            os.environ.update(c.pop("_env", {}))
            mod = _module(c.pop("_module", None))
            new = (lambda c, mod: lambda clean=False: mod.paged_indexer_logits(q, w, *parts, table, lens, ctx,
                                                                               next_n, clean, c))(c, mod)
            row[name + "_equal"] = bool(torch.equal(new(True), want)) and bool(torch.equal(new(False)[valid],
                                                                                          want_unclean[valid]))
            fns[name] = new
        if next_n < 4:
            fns["deepgemm"] = lambda: dispatch._deepgemm_paged(q, w, pool, table, lens, PAGE, ctx, next_n, False)
        for _ in range(REPS):
            for name, fn in fns.items():
                try:
                    row.setdefault(name + "_us", []).append(round(bk.bench_graph(fn) * 1e3, 2))
                except Exception as exc:  # noqa: BLE001
                    row[name + "_error"] = str(exc)[-200:]
        best = {k[:-3]: min(v) for k, v in row.items() if k.endswith("_us")}
        row["speed_vs_old"] = {k: round(best["old"] / v, 3) for k, v in best.items()}
        row["s"] = round(time.time() - t0)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(OUT, "sc_ab.json"), "w") as f:
            json.dump(res, f, indent=1)

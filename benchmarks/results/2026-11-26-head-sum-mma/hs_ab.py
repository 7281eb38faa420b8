"""A/B (env: VARIANTS, REPS, SHAPES, NEXT_N, VARIANT_NEXT_N: the next_n the variants run at, NEW_ONLY: variants of the new kernel only, NO_DEEPGEMM) of the Gluon paged indexer's head sum: the committed kernel (.ab/indexer_base.py: relu,
weight and head sum in fp32 on the CUDA cores) against .ab/indexer_mmasum.py (relu(q.k) rounded
to bf16, summed by a second wgmma against the weights split into bf16 high and low parts), each
at gluon_config's default and in the variants of VARIANTS (JSON {name: cfg overrides}).
CUDA graphs, alternating replays, best of REPS; agreement as each row's top-2048 overlap and the
relative error of the new logits against the committed kernel's (fp32, the reference's rounding)."""
import importlib.util, json, os, sys, time
sys.argv = [sys.argv[0], "--budget", "1"]
sys.path.insert(0, "benchmarks")
import torch
import bench_kernels as bk
from dsa_kernels import dispatch, indexer_logits


def _module(path):
    spec = importlib.util.spec_from_file_location("dsa_kernels." + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


old_mod, new_mod = _module(".ab/indexer_base.py"), _module(".ab/indexer_mmasum.py")
OUT = os.environ.get("OUT", "/tmp")
PAGE = bk.PAGE
SMS = torch.cuda.get_device_properties(0).multi_processor_count
VARIANTS = json.loads(os.environ.get("VARIANTS", "{}"))
REPS = int(os.environ.get("REPS", "3"))
only = [a for a in os.environ.get("SHAPES", "").split(",") if a]
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=[])
pool = bk.index_pool(128 * 131072 // PAGE + 64)
parts = indexer_logits.pool_parts(pool, PAGE)
t0 = time.time()


def agreement(got, want, lens):
    """Min over rows of the top-2048 overlap, and the median / max relative error where |want| is
    above 1% of the row's largest value."""
    overlaps, rel = [], []
    for i in range(0, got.shape[0], max(1, got.shape[0] // 16)):
        n = int(lens[i])
        g, w = got[i, :n], want[i, :n]
        k = min(2048, n)
        a = set(g.topk(k).indices.tolist()); b = set(w.topk(k).indices.tolist())
        overlaps.append(len(a & b) / k)
        big = w.abs() > 0.01 * w.abs().max()
        rel.append(((g - w).abs() / w.abs())[big])
    rel = torch.cat(rel)
    return dict(topk_overlap_min=round(min(overlaps), 5), topk_overlap_mean=round(sum(overlaps) / len(overlaps), 5),
                rel_err_median=float(rel.median()), rel_err_max=float(rel.max()))


for batch, ctx in ((32, 4096), (128, 4096), (32, 32768), (128, 32768), (32, 131072), (128, 131072)):
    if only and f"{batch}x{ctx}" not in only:
        continue
    for next_n in [int(n) for n in os.environ.get("NEXT_N", "1,2,4").split(",")]:
        q, w, table, lens = bk.paged_case(batch, ctx, next_n, pool)
        cfg = old_mod.gluon_config(batch, ctx, next_n, SMS)
        if cfg is None:
            continue
        row = dict(batch=batch, ctx=ctx, next_n=next_n, cfg=cfg)
        call = lambda mod, c: (lambda: mod.paged_indexer_logits(q, w, *parts, table, lens, ctx, next_n, False, c))
        fns = {"old": call(old_mod, cfg), "new": call(new_mod, cfg)}
        for name, extra in VARIANTS.items() if str(next_n) in os.environ.get("VARIANT_NEXT_N", "124") else ():
            if not os.environ.get("NEW_ONLY"):
                fns["old_" + name] = call(old_mod, {**cfg, **extra})
            fns["new_" + name] = call(new_mod, {**cfg, **extra})
        want = fns["old"]()
        for name, fn in fns.items():
            if name.startswith("new"):
                row[name + "_agree"] = agreement(fn(), want, lens)
            elif name != "old":
                valid = torch.arange(ctx, device=q.device)[None, :] < lens.reshape(-1, 1)
                row[name + "_equal"] = bool(torch.equal(fn()[valid], want[valid]))
        if next_n < 4 and not os.environ.get("NO_DEEPGEMM"):
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
        with open(os.path.join(OUT, "hs_ab.json"), "w") as f:
            json.dump(res, f, indent=1)
# next_n cost over next_n 1 for each kernel, per shape
for r1 in [r for r in res["rows"] if r["next_n"] == 1]:
    for r in [r for r in res["rows"] if r["next_n"] > 1 and (r["batch"], r["ctx"]) == (r1["batch"], r1["ctx"])]:
        b1 = {k[:-3]: min(v) for k, v in r1.items() if k.endswith("_us")}
        bn = {k[:-3]: min(v) for k, v in r.items() if k.endswith("_us")}
        base = lambda k: k if k in b1 else k.split("_")[0]  # a variant without its own next_n 1: its kernel's default
        r["cost_over_next_n_1"] = {k: round(v / b1[base(k)], 3) for k, v in bn.items() if base(k) in b1}
        print(json.dumps(dict(batch=r["batch"], ctx=r["ctx"], next_n=r["next_n"], cost=r["cost_over_next_n_1"])))
with open(os.path.join(OUT, "hs_ab.json"), "w") as f:
    json.dump(res, f, indent=1)

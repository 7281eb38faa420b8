"""The issue-4 targets from a bench_kernels.py results.json, a line a shape:
python3 targets.py RESULTS.json (sections absent from the file are skipped)."""
import json
import sys

d = json.load(open(sys.argv[1]))
rows = d["rows"]


def find(section, name, **kw):
    return next((r for r in rows if r["section"] == section and r["name"] == name
                 and all(r.get(k) == v for k, v in kw.items())), None)


print("copy GB/s", round(d["copy_GBps"]), [(r["name"], r.get("TFLOPs")) for r in rows if r["section"] == "ceiling"])
for ctx in (4096, 32768, 131072):
    for b in (1, 32, 128):
        g = {n: find("indexer", "default paged, CUDA graph", batch=b, ctx=ctx, next_n=n) for n in (1, 2, 4)}
        h = {n: find("indexer", "default paged, CUDA graph, keys from HBM", batch=b, ctx=ctx, next_n=n) for n in (1, 2, 4)}
        dg = {n: find("indexer", "deepgemm paged", batch=b, ctx=ctx, next_n=n) for n in (1, 2)}
        if not g[1]:
            continue
        s = f"indexer {b:3d} / {ctx // 1024:3d}K: next_n 1 {g[1]['ms'] * 1e3:7.2f} us, {g[1]['copy_frac']:.3f} of copy"
        if dg[1]:
            s += f", {dg[1]['default_over_dg_speed_graph']}x DeepGEMM"
        s += f"; next_n 2 {g[2]['ms'] / g[1]['ms']:.3f}x, next_n 4 {g[4]['ms'] / g[1]['ms']:.3f}x"
        if dg[1] and dg[2]:
            s += f" (DeepGEMM's next_n 2 {dg[2]['graph_ms'] / dg[1]['graph_ms']:.3f}x)"
        if h[1]:
            s += f"; keys from HBM: next_n 2 {h[2]['ms'] / h[1]['ms']:.3f}x, next_n 4 {h[4]['ms'] / h[1]['ms']:.3f}x"
        print(s)
for b, ctx in ((32, 32768), (128, 32768), (32, 131072), (128, 131072)):
    r = find("topk", "triton paged transform, indexer logits", batch=b, ctx=ctx)
    if r:
        print(f"top-k {b} / {ctx // 1024}K: {r['graph_frac_of_indexer_behind_it']}x behind our indexer "
              f"({r['graph_ms_behind_indexer'] * 1e3:.2f} us), {r['graph_frac_of_deepgemm_behind_it']}x behind DeepGEMM's")
for r in rows:
    if r["section"] in ("decode", "prefill") and r.get("default_over_fm_speed"):
        print(f"{r['section']} heads {r['heads']} batch {r.get('batch', r.get('nq'))}"
              f"{' FP8' if r.get('fp8') else ''}: {r['default_over_fm_speed']}x FlashMLA")
print(sum(c["ok"] for c in d["checks"]), "of", len(d["checks"]), "checks true")

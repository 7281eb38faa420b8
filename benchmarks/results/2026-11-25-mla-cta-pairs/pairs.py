"""Nineteenth session, H100. Needs `git apply benchmarks/results/2026-11-25-mla-cta-pairs/cta-pairs.patch`
(and, for pairs_ab.py, `patch -o .ab/gluon_vX.py kernels/sparse_mla_gluon.py variant-vX.diff`; va is the
patched kernel itself); run from the repository root on the device with dsa_kernels importable.
A/B of FP8 sparse MLA decode with CTA pairs (sparse_mla_gluon.PAIRS) against one CTA a head block.
  python3 pairs.py smoke   -- one small pair launch (run under a short timeout: a hang shows there)
  python3 pairs.py         -- correctness (bitwise against PAIRS=False, error against the reference), timings"""
import json, os, sys, time
import torch, triton.testing
from dsa_kernels import dispatch, reference, sparse_mla, sparse_mla_gluon as g

SLOTS, SCALE = 262144, 576 ** -0.5
OUT = os.environ.get("OUT", "/tmp")
torch.manual_seed(0)


def run(pairs, q, pool, idx, **kw):
    g.PAIRS = pairs
    return sparse_mla.sparse_mla(q, pool, idx, SCALE, **kw)


def ms(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


if sys.argv[1:] == ["smoke"]:
    pool = torch.zeros(300, 656, dtype=torch.uint8, device="cuda")
    dispatch.store_mla_kv(pool, torch.randn(300, 512, device="cuda"), torch.randn(300, 64, device="cuda"),
                          torch.arange(300, device="cuda"))
    q = torch.randn(2, 128, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, 300, (2, 256), device="cuda").int()
    a = run(True, q, pool, idx, config=dict(SPLIT=1), gluon=True)[0]
    torch.cuda.synchronize()
    b = run(False, q, pool, idx, config=dict(SPLIT=1), gluon=True)[0]
    ref = reference.sparse_mla_ref(q, pool, idx, SCALE)[0]
    print("smoke maxdiff pairs vs single", float((a.float() - b.float()).abs().max()),
          "err vs ref", float((a.float() - ref).norm() / ref.norm()), flush=True)
    sys.exit(0)

fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), checks=[], rows=[])
for heads, batch, topk, split in ((128, 5, 2048, None), (128, 2, 300, None), (128, 3, 40, 8), (128, 130, 2048, None),
                                  (256, 3, 500, None), (128, 4, 100, 3)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, topk), device="cuda").int()
    idx[0, topk // 3:] = -1
    idx[-1, :] = -1
    idx[min(1, batch - 1), ::7] = SLOTS + 5
    kw = dict(config=dict(SPLIT=split), gluon=True) if split else {}
    o1, l1 = run(True, q, fp8, idx, **kw)
    o0, l0 = run(False, q, fp8, idx, **kw)
    m = min(batch, 6)
    ref, ref_lse = reference.sparse_mla_ref(q[:m], fp8, idx[:m], SCALE)
    c = dict(heads=heads, batch=batch, topk=topk, split=split, equal=bool(torch.equal(o1, o0) and torch.equal(l1, l0)),
             maxdiff=float((o1.float() - o0.float()).abs().max()),
             rel_err=float((o1[:m].float() - ref).norm() / ref.norm()), last_row_zero=bool((o1[-1] == 0).all()))
    res["checks"].append(c)
    print(json.dumps(c), flush=True)
# replays of one graph: no drift, no hang
q = torch.randn(64, 128, 576, device="cuda").to(torch.bfloat16)
idx = torch.randint(0, SLOTS, (64, 2048), device="cuda").int()
want = run(False, q, fp8, idx)[0]
g.PAIRS = True
graph = torch.cuda.CUDAGraph()
run(True, q, fp8, idx)
with torch.cuda.graph(graph):
    got = run(True, q, fp8, idx)[0]
for _ in range(50):
    graph.replay()
torch.cuda.synchronize()
print(json.dumps(dict(graph_replays_equal=bool(torch.equal(got, want)))), flush=True)
for heads, batch in [(128, b) for b in (1, 16, 32, 64, 128)] + [(64, 128)]:
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    row = dict(heads=heads, batch=batch, split=sparse_mla.mla_config(batch, heads, 2048)["SPLIT"],
               equal=bool(torch.equal(run(True, q, fp8, idx)[0], run(False, q, fp8, idx)[0])))
    t = {"pairs": [], "single": []}
    for _ in range(2):
        t["pairs"].append(round(ms(lambda: run(True, q, fp8, idx)) * 1e3, 2))
        t["single"].append(round(ms(lambda: run(False, q, fp8, idx)) * 1e3, 2))
    row.update({f"{k}_us": v for k, v in t.items()})
    fm = ms(lambda: dispatch._flashmla_decode(q, fp8, idx, SCALE)) * 1e3
    row["flashmla_us"] = round(fm, 2)
    row["pairs_vs_fm"] = round(fm / min(t["pairs"]), 3)
    row["single_vs_fm"] = round(fm / min(t["single"]), 3)
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "pairs.json"), "w") as f:
        json.dump(res, f, indent=1)

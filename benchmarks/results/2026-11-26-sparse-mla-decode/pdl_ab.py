"""The in-kernel split merge against the committed kernels (old: a separate merge launch):
alternating CUDA-graph timings, FlashMLA in the same call, outputs compared."""
import json, os, sys, time
sys.path.insert(0, ".ab/oldk")
import torch, triton.testing
from dsa_kernels import dispatch, sparse_mla
from dsa_kernels_old import sparse_mla as old_mla
import importlib.util
_spec = importlib.util.spec_from_file_location("dsa_kernels.g_trigger", ".ab/gluon_trigger.py")
trig = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(trig)
plain = sparse_mla.sparse_mla_gluon
def with_module(mod):
    def run(q, pool, idx):
        sparse_mla.sparse_mla_gluon = mod
        return sparse_mla.sparse_mla(q, pool, idx, SCALE)
    return run
SCALE, SLOTS = 576 ** -0.5, 262144
def us(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")) * 1e3
torch.manual_seed(0)
fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for heads, n in ((128, 32), (128, 16), (64, 32), (64, 16), (128, 1), (64, 1), (128, 128)):
    q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    new = lambda: with_module(plain)(q, fp8, idx)
    trigger = lambda: with_module(trig)(q, fp8, idx)
    old = lambda: old_mla.sparse_mla(q, fp8, idx, SCALE)
    (o1, l1), (o0, l0) = new(), old()
    r = dict(heads=heads, n=n, split=sparse_mla.mla_config(n, heads, 2048)["SPLIT"],
             out_maxdiff=float((o1.float() - o0.float()).abs().max()), out_equal=bool(torch.equal(o1, o0)),
             lse_maxdiff=float((l1 - l0).abs().max()))
    r["trigger_equal"] = bool(torch.equal(trigger()[0], o1))
    fns = dict(new=new, trigger=trigger, old=old, flashmla=lambda: dispatch._flashmla_decode(q, fp8, idx, SCALE))
    for _ in range(3):
        for name, fn in fns.items():
            r.setdefault(name, []).append(round(us(fn), 2))
    r["new_vs_old"] = round(min(r["old"]) / min(r["new"]), 3)
    r["trigger_vs_old"] = round(min(r["old"]) / min(r["trigger"]), 3)
    r["trigger_vs_fm"] = round(min(r["flashmla"]) / min(r["trigger"]), 3)
    r["new_vs_fm"] = round(min(r["flashmla"]) / min(r["new"]), 3)
    r["old_vs_fm"] = round(min(r["flashmla"]) / min(r["old"]), 3)
    rows.append(r); print(json.dumps(r), flush=True)
    json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
              open(os.path.join(os.environ.get("OUT", "/tmp"), "pdl_ab.json"), "w"), indent=1)

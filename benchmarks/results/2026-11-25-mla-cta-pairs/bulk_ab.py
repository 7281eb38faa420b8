"""A/B of the Gluon sparse MLA (nineteenth session, H100): the committed kernel (.ab/gluon_base.py, from
`git show HEAD:kernels/sparse_mla_gluon.py`) against kernels/sparse_mla_gluon.py with a patch applied
(bulk-latent-copies.patch, or split-free.patch with the b512 variant left out), and .ab/gluon_b512.py
(`patch -o .ab/gluon_b512.py kernels/sparse_mla_gluon.py bulk-latent-512.diff` over the bulk patch).
FP8 and bf16 pools; from the repository root on the device."""
import importlib.util, json, os, sys, time
import torch, triton.testing
from dsa_kernels import dispatch, reference, sparse_mla, sparse_mla_gluon as new

SLOTS, SCALE = 262144, 576 ** -0.5
OUT = os.environ.get("OUT", "/tmp")
spec = importlib.util.spec_from_file_location("dsa_kernels.g_base", ".ab/gluon_base.py")
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)
spec = importlib.util.spec_from_file_location("dsa_kernels.g_b512", ".ab/gluon_b512.py")
b512 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b512)
VARIANTS = {"base": (base, 64, 2), "new": (new, 64, 2), "b512": (b512, 64, 2)}


def call(name, q, pool, idx, **kw):
    mod, n, nb = VARIANTS[name]
    sparse_mla.sparse_mla_gluon = mod
    return sparse_mla.sparse_mla(q, pool, idx, SCALE, **kw)


def ms(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


torch.manual_seed(0)
fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
bf16 = torch.randn(SLOTS, 576, device="cuda").to(torch.bfloat16)
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), checks=[], rows=[])
for pool_name, pool in (("fp8", fp8), ("bf16", bf16)):
    for heads, batch, topk, split in ((64, 3, 40, None), (128, 5, 2048, None), (64, 130, 2048, None), (128, 2, 300, None),
                                      (128, 3, 100, 3), (64, 4, 2048, 8), (128, 2, 1, None)):
        q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
        idx = torch.randint(0, SLOTS, (batch, topk), device="cuda").int()
        idx[0, max(topk // 3, 1):] = -1
        idx[-1, :] = -1
        idx[min(1, batch - 1), ::7] = SLOTS + 5
        kw = dict(config=dict(SPLIT=split), gluon=True) if split else {}
        m = min(batch, 6)
        ref, ref_lse = reference.sparse_mla_ref(q[:m], pool, idx[:m], SCALE)
        outs = {}
        for name in VARIANTS:
            o, l = call(name, q, pool, idx, **kw)
            outs[name] = o
            err = float((o[:m].float() - ref).norm() / ref.norm().clamp_min(1e-30))
            lse_err = float((l[:m] - ref_lse).abs().nan_to_num(0).max())
            c = dict(pool=pool_name, variant=name, heads=heads, batch=batch, topk=topk, split=split, rel_err=round(err, 6),
                     lse_err=lse_err, last_row_zero=bool((o[-1] == 0).all()),
                     equal_base=bool(torch.equal(o, outs["base"])))
            c["ok"] = err < (1e-2 if pool_name == "fp8" else 5e-3) and c["last_row_zero"] and lse_err < 3e-2
            res["checks"].append(c)
            if not c["ok"] or name == "new" and not c["equal_base"]:
                print("CHECK", json.dumps(c), flush=True)
print("checks", sum(c["ok"] for c in res["checks"]), "of", len(res["checks"]),
      "new equal to base:", all(c["equal_base"] for c in res["checks"] if c["variant"] == "new"), flush=True)
for pool_name, pool, heads, batch in [("fp8", fp8, 128, b) for b in (32, 64, 128)] + \
        [("fp8", fp8, 64, b) for b in (32, 128)]:
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    row = dict(pool=pool_name, heads=heads, batch=batch)
    for _ in range(2):
        for name in VARIANTS:
            row.setdefault(f"{name}_us", []).append(round(ms(lambda: call(name, q, pool, idx)) * 1e3, 2))
    if pool_name == "fp8":
        fm = ms(lambda: dispatch._flashmla_decode(q, pool, idx, SCALE)) * 1e3
        row["flashmla_us"] = round(fm, 2)
        for name in VARIANTS:
            row[f"{name}_vs_fm"] = round(fm / min(row[f"{name}_us"]), 3)
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "new_ab.json"), "w") as f:
        json.dump(res, f, indent=1)

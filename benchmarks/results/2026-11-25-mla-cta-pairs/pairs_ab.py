"""Nineteenth session, H100. Needs `git apply benchmarks/results/2026-11-25-mla-cta-pairs/cta-pairs.patch`
(and, for pairs_ab.py, `patch -o .ab/gluon_vX.py kernels/sparse_mla_gluon.py variant-vX.diff`; va is the
patched kernel itself); run from the repository root on the device with dsa_kernels importable.
Timing of sparse_mla_gluon variants (.ab/gluon_<name>.py) at 128 heads, FP8 pool, against the
committed kernel with PAIRS off and FlashMLA.  python3 pairs_ab.py va vb vc"""
import importlib.util, json, os, sys, time
import torch, triton.testing
from dsa_kernels import dispatch, reference, sparse_mla, sparse_mla_gluon as kept

SLOTS, SCALE = 262144, 576 ** -0.5
OUT = os.environ.get("OUT", "/tmp")


def load(name):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.g_{name}", f".ab/gluon_{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def call(mod, q, pool, idx):
    sparse_mla.sparse_mla_gluon = mod
    return sparse_mla.sparse_mla(q, pool, idx, SCALE)


def ms(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


kept.PAIRS = False
variants = {"single": kept}
for name in sys.argv[1:]:
    variants[name] = load(name)
torch.manual_seed(0)
fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for heads, batch in ((128, 32), (128, 64), (128, 128)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    base = call(kept, q, fp8, idx)[0]
    row = dict(heads=heads, batch=batch)
    for name, mod in variants.items():
        row[f"{name}_equal"] = bool(torch.equal(call(mod, q, fp8, idx)[0], base))
    for _ in range(2):
        for name, mod in variants.items():
            row.setdefault(f"{name}_us", []).append(round(ms(lambda: call(mod, q, fp8, idx)) * 1e3, 2))
    row["flashmla_us"] = round(ms(lambda: dispatch._flashmla_decode(q, fp8, idx, SCALE)) * 1e3, 2)
    rows.append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "pairs_ab_" + "_".join(sys.argv[1:]) + ".json"), "w") as f:
        json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)

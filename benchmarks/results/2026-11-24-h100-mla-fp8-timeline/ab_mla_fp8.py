"""The A/B driver behind timeline.json's "ab" rows (thirteenth session): each argument names a
kernel module .ab/gluon_<name>.py (a copy of kernels/sparse_mla_gluon.py, "kept", or a variant of
it), run in place of sparse_mla's Gluon kernel. Four correctness cases against the fp32 reference,
then ten FP8 decode shapes: max difference against the first module, two alternating CUDA-graph
timings each, FlashMLA in the same call; then three bf16-pool shapes. On the device, after
`source .device/setup.sh` with dsa_kernels importable:

    python3 benchmarks/results/2026-11-24-h100-mla-fp8-timeline/ab_mla_fp8.py kept <variant>

The variants themselves were not kept; docs/PERFORMANCE.md describes each."""
import importlib.util
import json
import os
import sys
import time

import torch
import triton.testing

from dsa_kernels import dispatch, reference, sparse_mla


def load(name, path):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.{name}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


VARIANTS = {}
for extra in sys.argv[1:]:
    VARIANTS[extra] = load(f"g_{extra}", f".ab/gluon_{extra}.py")
SLOTS, SCALE = 262144, 576 ** -0.5
OUT = os.environ.get("OUT", "/tmp")


def ms(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


def call(mod, q, pool, idx):
    sparse_mla.sparse_mla_gluon = mod
    return sparse_mla.sparse_mla(q, pool, idx, SCALE)


torch.manual_seed(0)
fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), checks=[], rows=[])
# correctness: short / uneven top-k, -1 entries, slots past the pool, an all-invalid row
for heads, batch, topk in ((64, 3, 40), (128, 5, 2048), (64, 130, 2048), (128, 2, 300)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, topk), device="cuda").int()
    idx[0, topk // 3:] = -1
    idx[-1, :] = -1
    idx[min(1, batch - 1), ::7] = SLOTS + 5
    m = min(batch, 6)
    ref, ref_lse = reference.sparse_mla_ref(q[:m], fp8, idx[:m], SCALE)
    for name, mod in VARIANTS.items():
        o, l = call(mod, q, fp8, idx)
        err = float((o[:m].float() - ref).norm() / ref.norm())
        lse_err = float((l[:m] - ref_lse).abs().nan_to_num(0).max())
        c = dict(variant=name, heads=heads, batch=batch, topk=topk, rel_err=round(err, 6), lse_err=lse_err,
                 last_row_zero=bool((o[-1] == 0).all()), ok=err < 1e-2 and bool((o[-1] == 0).all()))
        res["checks"].append(c)
        print(json.dumps(c), flush=True)
cases = [(64, b) for b in (1, 16, 32, 64, 128)] + [(128, b) for b in (1, 16, 32, 64, 128)]
for heads, batch in cases:
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    base_out = call(VARIANTS[sys.argv[1]], q, fp8, idx)[0]
    row = dict(heads=heads, batch=batch, split=sparse_mla.mla_config(batch, heads, 2048)["SPLIT"])
    for name, mod in VARIANTS.items():
        o = call(mod, q, fp8, idx)[0]
        row[f"{name}_maxdiff_vs_base"] = float((o.float() - base_out.float()).abs().max())
    t = {name: [] for name in VARIANTS}
    for _ in range(2):
        for name, mod in VARIANTS.items():
            t[name].append(round(ms(lambda: call(mod, q, fp8, idx)) * 1e3, 2))
    row.update({f"{name}_us": v for name, v in t.items()})
    try:
        row["flashmla_us"] = round(ms(lambda: dispatch._flashmla_decode(q, fp8, idx, SCALE)) * 1e3, 2)
        for name in VARIANTS:
            row[f"{name}_vs_fm"] = round(row["flashmla_us"] / min(t[name]), 3)
    except Exception as exc:  # noqa: BLE001
        row["flashmla_us"] = f"error: {str(exc)[:100]}"
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "ab_mla_fp8_" + "_".join(sys.argv[1:]) + ".json"), "w") as f:
        json.dump(res, f, indent=1)
# the same MMA schedule over a bf16 pool: what the FP8 path would take with dequantization free
bf16 = torch.randn(SLOTS, 576, device="cuda").to(torch.bfloat16)
for heads, batch in ((64, 128), (128, 64), (128, 128)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    row = dict(pool="bf16", heads=heads, batch=batch)
    outs = {name: call(mod, q, bf16, idx)[0] for name, mod in VARIANTS.items()}
    row["equal"] = all(torch.equal(o, outs[sys.argv[1]]) for o in outs.values())
    for _ in range(2):
        for name, mod in VARIANTS.items():
            row.setdefault(f"{name}_us", []).append(round(ms(lambda: call(mod, q, bf16, idx)) * 1e3, 2))
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
with open(os.path.join(OUT, "ab_mla_fp8_" + "_".join(sys.argv[1:]) + ".json"), "w") as f:
    json.dump(res, f, indent=1)

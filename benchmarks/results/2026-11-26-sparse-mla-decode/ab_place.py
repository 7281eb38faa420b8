"""FP8 dequantization by bit placement (FlashMLA's bf16(e) * bf16(scale)) against the kept kernel.
1) what FlashMLA's dequantization is: one valid key a row, so the output row is the dequantized row;
2) correctness against the fp32 reference; 3) alternating CUDA-graph timings, FlashMLA in the call."""
import importlib.util, json, os, sys, time
import torch, triton.testing
from dsa_kernels import dispatch, reference, sparse_mla

def load(name):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.g_{name}", f".ab/gluon_{name}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

NAMES = sys.argv[1:]
V = {n: load(n) for n in NAMES}
SCALE = 576 ** -0.5
OUT = os.environ.get("OUT", "/tmp")
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), probe=[], checks=[], rows=[])
def save():
    json.dump(res, open(os.path.join(OUT, "ab_place.json"), "w"), indent=1)
def call(mod, q, pool, idx):
    sparse_mla.sparse_mla_gluon = mod
    return sparse_mla.sparse_mla(q, pool, idx, SCALE)
def ms(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))

# 1) the probe: 64 rows, every e4m3 code (NaN codes -> 0) in every row, scales over 2^-30 .. 2^9
torch.manual_seed(0)
rows = 256
codes = (torch.arange(512)[None, :] * 37 + torch.arange(rows)[:, None] * 11) % 256
codes[(codes & 0x7F) == 0x7F] = 0
scales = (2.0 ** torch.empty(rows, 4).uniform_(-30, 9)) * torch.empty(rows, 4).uniform_(1, 2)
scales[0] = torch.tensor([1.0, 448.0, 2.0 ** -126, 300.0])
pool = torch.zeros(rows, 656, dtype=torch.uint8)
pool[:, :512] = codes.to(torch.uint8)
pool[:, 512:528] = scales.float().contiguous().view(torch.uint8).view(rows, 16)
pool[:, 528:] = torch.randn(rows, 64).to(torch.bfloat16).view(torch.uint8).view(rows, 128)
pool = pool.cuda()
e = codes.to(torch.uint8).view(torch.float8_e4m3fn).cuda().view(rows, 4, 128)
s = scales.cuda()[:, :, None]
want = dict(bf16_scale=(e.to(torch.bfloat16) * s.to(torch.bfloat16)).view(rows, 512),
            f32_scale=(e.float() * s).to(torch.bfloat16).view(rows, 512))
q = torch.randn(rows, 64, 576, device="cuda").to(torch.bfloat16)
idx = torch.full((rows, 64), -1, dtype=torch.int32, device="cuda")
idx[:, 5] = torch.arange(rows, device="cuda", dtype=torch.int32)
outs = {n: call(m, q, pool, idx)[0][:, 0] for n, m in V.items()}
try:
    outs["flashmla"] = dispatch._flashmla_decode(q, pool, idx, SCALE)[0].view(rows, 64, 512)[:, 0]
except Exception as exc:
    res["probe"].append(dict(flashmla_error=str(exc)[:300]))
for n, o in outs.items():
    row = dict(kernel=n)
    for k, w in want.items():
        bad = o.view(torch.int16) != w.view(torch.int16)
        row[k + "_mismatch"] = int(bad.sum())
        row[k + "_mismatch_rows_gt0"] = int(bad[1:].sum())
    res["probe"].append(row); print(json.dumps(row), flush=True)
save()

# 2) correctness against the fp32 reference
SLOTS = 262144
fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
for heads, batch, topk in ((64, 3, 40), (128, 5, 2048), (64, 130, 2048), (128, 2, 300)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, topk), device="cuda").int()
    idx[0, topk // 3:] = -1; idx[-1, :] = -1; idx[min(1, batch - 1), ::7] = SLOTS + 5
    m = min(batch, 6)
    ref, ref_lse = reference.sparse_mla_ref(q[:m], fp8, idx[:m], SCALE)
    for n, mod in V.items():
        o, l = call(mod, q, fp8, idx)
        err = float((o[:m].float() - ref).norm() / ref.norm())
        c = dict(variant=n, heads=heads, batch=batch, topk=topk, rel_err=round(err, 6),
                 lse_err=float((l[:m] - ref_lse).abs().nan_to_num(0).max()), last_row_zero=bool((o[-1] == 0).all()))
        res["checks"].append(c); print(json.dumps(c), flush=True)
save()

# 3) timings
for heads, batch in ((128, 128), (128, 64), (128, 32), (128, 16), (64, 128), (64, 32)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    base = call(V[NAMES[0]], q, fp8, idx)[0]
    row = dict(heads=heads, batch=batch)
    for n, mod in V.items():
        row[f"{n}_maxdiff"] = float((call(mod, q, fp8, idx)[0].float() - base.float()).abs().max())
    t = {n: [] for n in V}
    for _ in range(3):
        for n, mod in V.items():
            t[n].append(round(ms(lambda: call(mod, q, fp8, idx)) * 1e3, 2))
    row.update({f"{n}_us": v for n, v in t.items()})
    fm = round(ms(lambda: dispatch._flashmla_decode(q, fp8, idx, SCALE)) * 1e3, 2)
    row["flashmla_us"] = fm
    row.update({f"{n}_vs_fm": round(fm / min(t[n]), 3) for n in V})
    res["rows"].append(row); print(json.dumps(row), flush=True); save()

"""Per-tile phase timeline (clock64) of the FP8 sparse MLA kernel's three warpgroups (thirteenth
session, docs/PERFORMANCE.md). Ad hoc, kept to reproduce the figures in timeline.json:

    mkdir -p .ab && patch -o .ab/gluon_stamped.py kernels/sparse_mla_gluon.py \
        benchmarks/results/2026-11-24-h100-mla-fp8-timeline/clock64-stamps.patch
    # on the device, after source .device/setup.sh (and dsa_kernels importable):
    python3 benchmarks/results/2026-11-24-h100-mla-fp8-timeline/trace_mla.py stamped

Each argument names .ab/gluon_<name>.py; all are timed, the stamped ones traced. Stamps per tile:
gatherer 0 top of its iteration, 1 copies issued (after the wait for the buffer), 2 copies landed,
3 tile dequantized; scorer 0 tile ready, 1 QK done, 2 P handed over, 3 buffer given back; second
warpgroup 0 P received, 1 its P V done."""
import importlib.util
import json
import os
import sys

import torch
import triton.testing

from dsa_kernels import dispatch, sparse_mla

def load(name, path):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.{name}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m

mods = {name: load(f"g_{name}", f".ab/gluon_{name}.py") for name in sys.argv[1:]}
SLOTS, SCALE = 262144, 576 ** -0.5
OUT = os.environ.get("OUT", "/tmp")
torch.manual_seed(0)
fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
def call(mod, q, pool, idx):
    sparse_mla.sparse_mla_gluon = mod
    return sparse_mla.sparse_mla(q, pool, idx, SCALE)
def med(x):
    return float(x.float().median())
res = {}
for heads, batch in ((128, 128), (128, 64), (64, 128)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
    row = {}
    for name, mod in mods.items():
        if hasattr(mod, "TRACE"):
            mod.TRACE = torch.zeros(batch * (heads // 64) * 3 * 32 * 4 + 8, dtype=torch.int64, device="cuda")
        row[f"{name}_us"] = round(float(triton.testing.do_bench_cudagraph(lambda: call(mod, q, fp8, idx), rep=30, return_mode="median")) * 1e3, 1)
    for name, mod in mods.items():
        if not hasattr(mod, "TRACE"):
            continue
        mod.TRACE.zero_()
        call(mod, q, fp8, idx)
        torch.cuda.synchronize()
        tr = mod.TRACE[:-8].view(-1, 3, 32, 4)
        torch.save(tr.cpu(), os.path.join(OUT, f"trace_{name}_{heads}h_b{batch}.pt"))
        g, s, w = tr[:, 2], tr[:, 0], tr[:, 1]
        mid = slice(3, 30)
        d = dict(
            g_wait_and_issue=med(g[:, mid, 1] - g[:, mid, 0]), g_landing=med(g[:, mid, 2] - g[:, mid, 1]),
            g_dequant=med(g[:, mid, 3] - g[:, mid, 2]), g_period=med(g[:, 4:31, 0] - g[:, 3:30, 0]),
            s_wait_ready=med(s[:, mid, 0] - s[:, 2:29, 3]), s_qk=med(s[:, mid, 1] - s[:, mid, 0]),
            s_softmax_p=med(s[:, mid, 2] - s[:, mid, 1]), s_pv=med(s[:, mid, 3] - s[:, mid, 2]),
            w_wait=med(w[:, mid, 0] - w[:, 2:29, 1]), w_pv=med(w[:, mid, 1] - w[:, mid, 0]),
            period=med((s[:, 29, 3] - s[:, 3, 3]) / 26.0),
            cta_cycles=med(s[:, 31, 3] - g[:, 0, 0]),
            ready_after_free=med(g[:, mid, 3] - s[:, 1:28, 3]),
        )
        row[name] = {k: round(v) for k, v in d.items()}
    res[f"{heads}h_b{batch}"] = row
    print(heads, batch, json.dumps(row), flush=True)
json.dump(res, open(os.path.join(OUT, "trace_mla.json"), "w"), indent=1)

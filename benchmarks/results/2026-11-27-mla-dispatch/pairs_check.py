"""Balanced grids in CTA pairs: each shape in a subprocess with a deadline (a hang is a finding)."""
import subprocess, sys, json
CASE = r'''
import sys, torch, json
from dsa_kernels import dispatch, sparse_mla
heads, batch, topk, wave = map(int, sys.argv[1:5])
torch.manual_seed(batch)
SLOTS=1<<16
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
idx = torch.randint(0, SLOTS, (batch, topk), device="cuda").int()
idx[0, 700:] = -1
cfg = dict(sparse_mla.mla_config(batch, heads, topk), SPLIT=1, WAVE_ROWS=wave)
a, la = sparse_mla.sparse_mla(q, pool, idx, 576**-0.5, config=dict(cfg, BALANCED=False), gluon=True)
b, lb = sparse_mla.sparse_mla(q, pool, idx, 576**-0.5, config=dict(cfg, BALANCED=True), gluon=True)
torch.cuda.synchronize()
print(json.dumps(dict(heads=heads, batch=batch, topk=topk, wave=wave, pairs=sparse_mla.sparse_mla_gluon.PAIRS,
      rel=float((a.float()-b.float()).norm()/a.float().norm()), lse=float((la-lb).abs().nan_to_num().max()))))
'''
ok = True
for shape in ("128 34 2048 0", "128 70 2048 66", "128 4 2048 0", "128 1 64 0", "128 100 2048 0", "128 45 2048 0",
              "256 20 2048 0"):
    try:
        r = subprocess.run([sys.executable, "-c", CASE, *shape.split()], capture_output=True, text=True, timeout=90)
        print(shape, r.stdout.strip()[-300:], r.stderr.strip()[-600:] if r.returncode else "", flush=True)
        ok &= r.returncode == 0
    except subprocess.TimeoutExpired:
        print(shape, "HANG", flush=True)
        ok = False
        break
sys.exit(0 if ok else 1)

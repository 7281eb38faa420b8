"""The meeting path runs (no merge launch) and matches the merge-kernel path."""
import torch
from dsa_kernels import sparse_mla, dispatch
SLOTS, TOPK, SCALE = 262144, 2048, 576 ** -0.5
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"), torch.arange(SLOTS, device="cuda"))
for heads, batch in ((128, 34), (128, 70), (128, 100), (64, 133), (64, 67)):
    q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (batch, TOPK), device="cuda").int()
    idx[0, 1000:] = -1; idx[-1] = -1
    cfg = dict(sparse_mla.mla_config(batch, heads, TOPK), BALANCED=True)
    calls = []
    real = sparse_mla._merge_balanced_kernel
    class Spy:
        def __getitem__(self, g):
            calls.append(g); return real[g]
    sparse_mla._merge_balanced_kernel = Spy()
    a, la = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=cfg, gluon=True)
    sparse_mla._merge_balanced_kernel = real
    torch.cuda.synchronize()
    met = not calls
    from dsa_kernels import grid_barrier
    saved = grid_barrier.counters
    grid_barrier.counters = lambda *a, **k: None
    b, lb = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=cfg, gluon=True)
    grid_barrier.counters = saved
    torch.cuda.synchronize()
    fin = torch.isfinite(lb)
    print(dict(heads=heads, batch=batch, met=met, equal=bool(torch.equal(a, b)), max_abs=float((a.float() - b.float()).abs().max()),
               lse_equal=bool(torch.equal(la[fin], lb[fin]))), flush=True)

"""Debug: uniform paths vs reference, then balanced cases one per subprocess with a timeout."""
import subprocess, sys, json, time
import torch
sys.path.insert(0, "tests/kernels")

def case(kind, heads, batch, topk, fp8):
    from dsa_kernels import sparse_mla, reference, cache_store
    from dsa_kernels import sparse_mla_gluon as G
    SCALE = 576 ** -0.5
    slots = 1 << 14
    g = torch.Generator(device="cuda").manual_seed(batch * heads)
    pool = torch.zeros(slots, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
    cache_store.store_mla(pool, torch.randn(slots, 512, device="cuda", generator=g), torch.randn(slots, 64, device="cuda", generator=g), torch.arange(slots, device="cuda"))
    q = (torch.randn(batch, heads, 576, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    idx = torch.randint(0, slots, (batch, topk), device="cuda", generator=g).int()
    idx[0, 700:] = -1
    if batch > 1: idx[1] = -1
    want, _ = reference.sparse_mla_ref(q, pool, idx, SCALE)
    cfg = dict(sparse_mla.mla_config(batch, heads, topk), SPLIT=1)
    t0 = time.time()
    if kind == "uniform":
        out, lse = sparse_mla.sparse_mla(q, pool, idx, SCALE)
        G.PAIRS = False
        one, _ = sparse_mla.sparse_mla(q, pool, idx, SCALE)
        extra = dict(equal_one_cta=bool(torch.equal(out, one)))
    else:
        whole, _ = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(cfg, BALANCED=False), gluon=True)
        torch.cuda.synchronize()
        out, lse = sparse_mla.sparse_mla(q, pool, idx, SCALE, config=dict(cfg, BALANCED=True), gluon=True)
        torch.cuda.synchronize()
        extra = dict(vs_whole=float(((out.float() - whole.float()).norm() / whole.float().norm())),
                     nan=bool(out.isnan().any()))
    torch.cuda.synchronize()
    err = float((out.float().double() - want.double()).norm() / want.double().norm())
    print(json.dumps(dict(kind=kind, heads=heads, batch=batch, topk=topk, fp8=fp8, err=err, s=round(time.time() - t0, 1), **extra)), flush=True)

if __name__ == "__main__":
    if len(sys.argv) > 1:
        a = sys.argv[1:]
        case(a[0], int(a[1]), int(a[2]), int(a[3]), a[4] == "1")
        sys.exit()
    cases = [("uniform", 128, 64, 2048, 1), ("uniform", 128, 32, 2048, 1), ("uniform", 128, 5, 2048, 1), ("uniform", 64, 3, 2048, 0),
             ("balanced", 128, 1, 64, 0), ("balanced", 128, 1, 64, 1), ("balanced", 64, 5, 100, 1), ("balanced", 128, 4, 2048, 1),
             ("balanced", 128, 70, 2048, 1), ("balanced", 64, 67, 2000, 0)]
    for c in cases:
        r = subprocess.run([sys.executable, __file__, *map(str, c)], capture_output=True, text=True, timeout=None) if False else None
        try:
            r = subprocess.run([sys.executable, __file__, *map(str, c)], capture_output=True, text=True, timeout=75)
            print(r.stdout.strip() or ("ERR " + str(c) + " " + r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no output"), flush=True)
        except subprocess.TimeoutExpired:
            print("TIMEOUT", c, flush=True)

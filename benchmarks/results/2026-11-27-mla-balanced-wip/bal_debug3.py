"""Debug 2: where a multi-run balanced call hangs: the kernel or the merge; small cases with chosen program counts."""
import subprocess, sys, json, time
import torch

def case(heads, batch, topk, fp8, programs):
    from dsa_kernels import sparse_mla, reference, cache_store
    from dsa_kernels import sparse_mla_gluon as G
    SCALE = 576 ** -0.5
    slots = 1 << 12
    pool = torch.zeros(slots, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
    cache_store.store_mla(pool, torch.randn(slots, 512, device="cuda"), torch.randn(slots, 64, device="cuda"), torch.arange(slots, device="cuda"))
    q = (torch.randn(batch, heads, 576, device="cuda") * 0.5).to(torch.bfloat16)
    idx = torch.randint(0, slots, (batch, topk), device="cuda").int()
    want, want_lse = reference.sparse_mla_ref(q, pool, idx, SCALE)
    torch.cuda.synchronize()
    units, tiles = batch * heads // 64, (topk + 63) // 64
    part = torch.full((programs * 128, 512), float("nan"), device="cuda")
    part_lse = torch.full((programs * 128,), float("nan"), device="cuda")
    out = torch.full((batch, heads, 512), float("nan"), device="cuda").to(torch.bfloat16)
    lse = torch.full((batch, heads), float("nan"), device="cuda")
    views = (pool.view(torch.float8_e4m3fn), pool.view(torch.float32), pool.view(torch.bfloat16)) if fp8 else (pool,) * 3
    print("launch", flush=True)
    G.launch_balanced(q, views, 656 if fp8 else 576, slots, idx, topk, part, part_lse, out, lse, SCALE * 1.4426950408889634, fp8, programs)
    torch.cuda.synchronize()
    print("kernel done", flush=True)
    pieces = sparse_mla.balanced_pieces(units, tiles, programs)
    sparse_mla._merge_balanced_kernel[(programs, 64)](part, part_lse, out, lse, tiles, units * tiles, PIECES=sparse_mla.next_power_of_2(pieces))
    torch.cuda.synchronize()
    err = float((out.float().double() - want.double()).norm() / want.double().norm())
    print(json.dumps(dict(heads=heads, batch=batch, topk=topk, fp8=fp8, programs=programs, err=err, nan=bool(out.isnan().any()))), flush=True)

if __name__ == "__main__":
    if len(sys.argv) > 1:
        a = sys.argv[1:]
        case(int(a[0]), int(a[1]), int(a[2]), a[3] == "1", int(a[4]))
        sys.exit()
    for c in [(64, 3, 256, 0, 2), (64, 3, 256, 0, 5), (128, 70, 2048, 1, 132)]:
        try:
            r = subprocess.run([sys.executable, __file__, *map(str, c)], capture_output=True, text=True, timeout=40)
            print(c, r.stdout.strip().replace("\n", " | "), (r.stderr.strip().splitlines() or [""])[-1], flush=True)
        except subprocess.TimeoutExpired as e:
            print("TIMEOUT", c, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else e.stdout, flush=True)

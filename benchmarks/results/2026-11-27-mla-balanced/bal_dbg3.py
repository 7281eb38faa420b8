"""Balanced grid debug 3: per-program progress words in pinned host memory (read while a kernel
hangs) and, for kernels that finish, every run checked against a reference over its own range.
Needs the kernel built with the debug-only `_mark` calls this directory's README shows (DSA_MLA_DBG=1
switched them on); the progress words' address goes in as keys_per_split."""
import json, os, subprocess, sys, time
import torch

LOG2E = 1.4426950408889634


def runs_of(c, programs, tpu, total, topk, H):
    first, last = c * total // programs, (c + 1) * total // programs
    g, out = first, []
    nruns = (last - 1) // tpu - first // tpu + 1 if last > first else 0
    for r in range(nruns):
        u = g // tpu
        t0, t1 = g - u * tpu, min(last - u * tpu, tpu)
        rows = total // tpu // (H // 64)
        out.append(dict(r=r, n=u % rows, h0=u // rows * 64, lo=t0 * 64, end=min(t1 * 64, topk),
                        partial=(t0 > 0) or (t1 < tpu), row=(c * 2 + min(r, 1)) * 64, tiles=t1 - t0))
        g = u * tpu + t1
    return out


def case(heads, batch, topk, fp8, programs, total=None):
    os.environ["DSA_MLA_DBG"] = "1"
    from dsa_kernels import sparse_mla, reference, cache_store
    from dsa_kernels import sparse_mla_gluon as G
    SCALE = 576 ** -0.5
    slots = 1 << 12
    torch.manual_seed(0)
    pool = torch.zeros(slots, 656 if fp8 else 576, dtype=torch.uint8 if fp8 else torch.bfloat16, device="cuda")
    cache_store.store_mla(pool, torch.randn(slots, 512, device="cuda"), torch.randn(slots, 64, device="cuda"), torch.arange(slots, device="cuda"))
    q = (torch.randn(batch, heads, 576, device="cuda") * 0.5).to(torch.bfloat16)
    idx = torch.randint(0, slots, (batch, topk), device="cuda").int()
    tpu = (topk + 63) // 64
    units = batch * heads // 64
    total = total or units * tpu
    part = torch.full((programs * 128, 512), float("nan"), device="cuda")
    part_lse = torch.full((programs * 128,), float("nan"), device="cuda")
    out = torch.full((batch, heads, 512), float("nan"), device="cuda").to(torch.bfloat16)
    lse = torch.full((batch, heads), float("nan"), device="cuda")
    views = (pool.view(torch.float8_e4m3fn), pool.view(torch.float32), pool.view(torch.bfloat16)) if fp8 else (pool,) * 3
    words = torch.zeros(programs * 8, dtype=torch.int32, pin_memory=True)
    torch.cuda.synchronize()
    G._sparse_mla_kernel[(programs,)](
        q, q.stride(0), q.stride(1), *views, 656 if fp8 else 576, slots, idx, idx.stride(0), topk, part, part_lse,
        SCALE * LOG2E, words.data_ptr(), 1, part, out, lse, tpu, total,
        H=heads, FP8=fp8, PARTIAL=True, MERGE=0, BALANCED=True, num_warps=G.NUM_WARPS)
    ev = torch.cuda.Event()
    ev.record()
    t_end = time.time() + 12
    while not ev.query() and time.time() < t_end:
        time.sleep(0.05)
    plan = [runs_of(c, programs, tpu, total, topk, heads) for c in range(programs)]
    w = words.view(programs, 8).tolist()
    if not ev.query():
        stuck = []
        for c in range(programs):
            nr, nt = len(plan[c]), sum(x["tiles"] for x in plan[c])
            want = [nr, nt, nt, nt, nr, nr, nt, nt]
            if w[c] != want:
                stuck.append((c, w[c], want, [(x["tiles"], int(x["partial"])) for x in plan[c]]))
        print(json.dumps(dict(case=[heads, batch, topk, fp8, programs, total], hung=True, stuck=len(stuck),
                              first=stuck[:6])), flush=True)
        os._exit(3)
    torch.cuda.synchronize()
    bad, worst = [], {"whole": 0.0, "partial": 0.0, "lse": 0.0}
    for c in range(programs):
        for x in plan[c]:
            n, h0, lo, end = x["n"], x["h0"], x["lo"], x["end"]
            ref, ref_lse = reference.sparse_mla_ref(q[n:n + 1, h0:h0 + 64], pool, idx[n:n + 1, lo:end], SCALE)
            ref, ref_lse = ref[0], ref_lse[0]
            if x["partial"]:
                got, got_lse = part[x["row"]:x["row"] + 64], part_lse[x["row"]:x["row"] + 64] / LOG2E
            else:
                got, got_lse = out[n, h0:h0 + 64].float(), lse[n, h0:h0 + 64]
            e = [float((got[:, s] - ref[:, s]).norm() / ref[:, s].norm()) for s in (slice(0, 256), slice(256, 512))]
            el = float((got_lse - ref_lse).abs().max())
            kind = "partial" if x["partial"] else "whole"
            worst[kind] = max(worst[kind], *e)
            worst["lse"] = max(worst["lse"], el)
            if max(e) > 2e-2 or el > 1e-2 or e != e:
                bad.append(dict(c=c, **{k: x[k] for k in ("r", "n", "h0", "lo", "end", "partial", "row")}, err=e, lse=el))
    print(json.dumps(dict(case=[heads, batch, topk, fp8, programs, total], hung=False, worst=worst, bad=len(bad),
                          first=bad[:8])), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        a = [int(v) for v in sys.argv[1:]]
        case(a[0], a[1], a[2], a[3] == 1, a[4], a[5] if len(a) > 5 else None)
        sys.exit()
    cases = [(64, 2, 256, 0, 1), (64, 3, 256, 0, 5), (64, 3, 256, 0, 2),
             (128, 1, 256, 0, 1), (64, 2, 256, 1, 1), (128, 3, 256, 1, 2), (128, 70, 2048, 1, 132)]
    for c in cases:
        try:
            r = subprocess.run([sys.executable, __file__, *map(str, c)], capture_output=True, text=True, timeout=150)
            lines = r.stdout.strip().splitlines()
            print(lines[-1] if lines else ("ERR " + str(c) + " " + " | ".join(r.stderr.strip().splitlines()[-3:])), flush=True)
        except subprocess.TimeoutExpired:
            print("TIMEOUT", c, flush=True)

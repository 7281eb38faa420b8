"""Why the top-k takes 2-4 us longer behind the indexer than alone (H100, 32 / 32K: 12.5 against
15-16.6 us). CUDA-graph times of the top-k behind several predecessors, and its own kernel duration
(profiler, eager) alone and behind the indexer.

Ran on d6dde0b's kernels (the one-launch top-k still a programmatic dependent launch; `top(x, False)`
launches it as a plain one). From the repository root on the device, after source .device/setup.sh
and the dsa_kernels link of benchmarks/device_checks.sh:
    python3 benchmarks/results/2026-11-25-topk-after-indexer/gap.py   (writes $OUT/gap.json)"""
import json, os, sys
import torch
import triton.testing
sys.path.insert(0, "benchmarks")
import topk_ab as ab
from dsa_kernels import indexer_logits, topk, topk_cooperative as tc

OUT = os.environ.get("OUT", ".")
res = []
def g(fn):
    return 1000 * float(triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median"))

src = torch.empty(1 << 25, device="cuda"); dst = torch.empty_like(src)
flush = lambda: dst.copy_(src)
tiny_buf = torch.zeros(1, device="cuda")
tiny = lambda: tiny_buf.add_(1)

def kernel_us(fn, name, n=30):
    from torch.profiler import profile, ProfilerActivity
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n): fn()
        torch.cuda.synchronize()
    ds = sorted(e.device_time for e in prof.events() if e.device_time > 0 and name in e.name)
    return ds[len(ds) // 2] if ds else None

for n, w in [(32, 32768), (16, 32768), (8, 131072)]:
    case, lens, table = ab.indexer_case(n, w, indexer_logits.indexer_gluon)
    logits = case(); saved = logits.clone()
    parts = tc.parts_per_row(n, w, ab.SMS)
    out = torch.empty(n, ab.K, device="cuda", dtype=torch.int32)
    def top(x, pdl=True):
        opts = tc._launch_options
        if not pdl:
            tc._launch_options = lambda d: dict(PDL=False, launch_cooperative_grid=True)
        try:
            assert tc.cooperative_topk(x, lens, None, ab.K, parts, out, topk.TRANSFORM_PAGED, table, ab.PAGE, 1, None)
        finally:
            tc._launch_options = opts
        return out
    copy_logits = lambda: logits.copy_(saved)
    r = dict(shape=[n, w], parts=parts)
    r["indexer"] = g(case)
    r["alone"] = g(lambda: top(logits))
    r["alone_nopdl"] = g(lambda: top(logits, False))
    r["behind_indexer"] = g(lambda: top(case())) - r["indexer"]
    r["behind_indexer_nopdl"] = g(lambda: top(case(), False)) - r["indexer"]
    t = g(lambda: (case(), tiny()))
    r["behind_indexer_tiny"] = g(lambda: (lambda x: (tiny(), top(x)))(case())) - t
    c = g(copy_logits); r["copy_4MB"] = c
    r["behind_copy"] = g(lambda: (copy_logits(), top(logits))) - c
    f = g(flush); r["flush"] = f
    r["behind_flush"] = g(lambda: (flush(), top(logits))) - f
    fc = g(lambda: (flush(), copy_logits()))
    r["behind_flush_copy"] = g(lambda: (flush(), copy_logits(), top(logits))) - fc
    r["kernel_alone_us"] = kernel_us(lambda: top(logits), "_topk_kernel")
    r["kernel_behind_indexer_us"] = kernel_us(lambda: top(case()), "_topk_kernel")
    r["kernel_behind_copy_us"] = kernel_us(lambda: (copy_logits(), top(logits)), "_topk_kernel")
    r["indexer_kernel_us"] = kernel_us(case, "_paged_logits_kernel")
    r = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
    res.append(r); print(json.dumps(r), flush=True)
    json.dump(res, open(os.path.join(OUT, "gap.json"), "w"), indent=1)

"""Top-k time on rows whose sample misleads (the k-th key below / above the bracket), on rows full
of ties and on normal rows: the kernel as it stands ("new"), kernel copies head.py and rel16.py
(e.g. with relist-as-measured.diff applied, MAX_SPAN 16 slices) and the three launches. Run from
the repository root on the device with the copies beside it in .ab/ (the paths below), as
`python3 .ab/worst.py`; writes $OUT/worst.json."""
import json, os, sys, torch, triton.testing
sys.argv = [sys.argv[0], "nochecks"]
sys.path.insert(0, "benchmarks")
import topk_ab as ab
from dsa_kernels import topk_cooperative, topk
variants = {"new": topk_cooperative, "head": ab.load_variant("head", ".ab/head.py"),
            "rel16": ab.load_variant("rel16", ".ab/rel16.py"), "three": topk}
g = torch.Generator(device="cuda").manual_seed(3)
res = []
for n, w in [(128, 131072), (64, 131072), (256, 65536), (128, 32768), (32, 131072)]:
    for kind in ("randn", "below", "above", "bf16", "skew"):
        logits = ab.rows_of(kind, n, w, g)
        if kind in ("below", "above"):  # one misleading row among normal ones
            x = torch.randn(n, w, device="cuda", generator=g); x[n // 2] = logits[n // 2]; logits = x
        lens = torch.full((n,), w, device="cuda", dtype=torch.int32)
        table = torch.randperm(n * w // 64, device="cuda", generator=g).view(n, -1).int()
        want = ab.expected(logits, lens, table)
        for name, mod in variants.items():
            run = ab.runner(mod, n, w)
            if run is None:
                continue
            exact = torch.equal(run(logits, lens, table), want)
            us = 1000 * triton.testing.do_bench_cudagraph(lambda: run(logits, lens, table), rep=30, return_mode="median")
            r = dict(shape=[n, w], kind=kind, kernel=name, parts=getattr(mod, "parts_per_row", lambda *a: None)(n, w, ab.SMS), us=round(us, 1), exact=exact)
            res.append(r); print(json.dumps(r), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "worst.json"), "w"), indent=1)

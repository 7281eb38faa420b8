"""Our ragged (prefill) indexer logits before and after computing only the tiles a query block
sees: the kernel of a copy given as the first argument ("base") against kernels/indexer_logits.py
("new"), CUDA graphs, alternating, best of three, clean_logits False and True; outputs compared
bit for bit over every query's own range (and everywhere when clean). Shapes: R requests of L
tokens back to back (causal inside each), and bench_kernels' one chunk of 4096 queries at the end
of 32K keys. Run: source .device/setup.sh && python3 ragged_ab.py .ab/indexer_base.py
"""

import importlib.util
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from graph_timing import graph_ms  # noqa: E402

from dsa_kernels import indexer_logits  # noqa: E402

spec = importlib.util.spec_from_file_location("dsa_kernels.ab_indexer_base", sys.argv[1])
base = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)

DEV, H = "cuda", 64
RES = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), rows=[])
g = torch.Generator(device=DEV).manual_seed(0)


def log(**row):
    RES["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "ragged_ab.json"), "w") as f:
        json.dump(RES, f, indent=1)


def shape(name, nq, nk, k_start, k_end):
    q = (torch.randn(nq, H, 128, device=DEV, generator=g) * 0.5).to(torch.float8_e4m3fn)
    w = torch.randn(nq, H, device=DEV, generator=g)
    k8 = (torch.randn(nk, 128, device=DEV, generator=g) * 0.5).to(torch.float8_e4m3fn)
    ks = torch.rand(nk, device=DEV, generator=g) + 0.5
    for clean in (False, True):
        fns = {name_: (lambda m=m: m.ragged_indexer_logits(q, w, k8, ks, k_start, k_end, clean_logits=clean))
               for name_, m in (("base", base), ("new", indexer_logits))}
        a, b = fns["base"](), fns["new"]()
        if clean:
            same = bool(torch.equal(a, b))
        else:
            pos = torch.arange(nk, device=DEV)
            seen = (pos[None, :] >= k_start[:, None]) & (pos[None, :] < k_end[:, None])
            same = bool(torch.equal(torch.where(seen, a, 0), torch.where(seen, b, 0)))
        del a, b
        best = {n: float("inf") for n in fns}
        for r in range(3):
            for n in (("base", "new") if r % 2 == 0 else ("new", "base")):
                best[n] = min(best[n], graph_ms(fns[n]))
        log(shape=name, clean=clean, base_ms=round(best["base"], 4), new_ms=round(best["new"], 4),
            speed=round(best["base"] / best["new"], 3), equal=same)
    torch.cuda.empty_cache()


def requests(r, length):
    t = r * length
    idx = torch.arange(t, device=DEV)
    start = (idx // length * length).int()
    shape(f"{r} x {length}", t, t, start, (start + idx % length + 1).int())


if __name__ == "__main__":
    for r, length in ((1, 16384), (4, 4096), (16, 1024), (64, 256)):
        requests(r, length)
    nq, nk = 4096, 32768
    shape("4096 q at the end of 32K", nq, nk, torch.zeros(nq, dtype=torch.int32, device=DEV),
          (nk - nq + 1 + torch.arange(nq, device=DEV)).int())

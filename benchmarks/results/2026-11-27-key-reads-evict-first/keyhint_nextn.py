"""A/B: the paged indexer's key reads with an L2 evict_first hint (PTX patched through ir_override),
next_n 1 / 2 / 4 at large grids: indexer alone, CUDA graphs. source .device/setup.sh && python3 .ab/keyhint_nextn.py"""
import json, math, os, sys, time
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".ab")
import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from dsa_kernels import indexer_gluon as ig, indexer_logits
from dsa_kernels.device import num_sms
from dsa_kernels.host_math import cdiv
from graph_timing import graph_ms
from keyhint_ab import patch, PTX_DIR

DEV, PAGE = "cuda", 64
SMS = num_sms(torch.device(DEV))
OUT = os.environ.get("OUT", ".")
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), checks=[], rows=[])


def log(sec, **f):
    R[sec].append(f)
    print(sec, json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(OUT, "keyhint_nextn.json"), "w"), indent=1)


def case(batch, w, next_n, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = batch * next_n
    pages = batch * math.ceil(w / PAGE)
    pool = torch.empty(pages + 64, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pages + 64, PAGE * 128, device=DEV, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages + 64, PAGE, device=DEV, generator=g) * 0.02 + 0.01).view(torch.uint8)
    table = torch.randperm(pool.shape[0], device=DEV, generator=g)[:pages].view(batch, -1).int()
    lens = (torch.full((batch, 1), w - next_n + 1, device=DEV) + torch.arange(next_n, device=DEV)).reshape(-1).int()
    q = torch.randn(n, 64, 128, device=DEV, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(n, 64, device=DEV, generator=g) * 0.1
    keys, scales = indexer_logits.pool_parts(pool, PAGE)
    key_tiles = TensorDescriptor.from_tensor(keys, [1, 64, 128], ig.KEY_TILE_LAYOUT)
    scale_tiles = TensorDescriptor.from_tensor(scales, [1, 64], ig.SCALE_TILE_LAYOUT)
    cfg = ig.gluon_config(batch, w, next_n, SMS)
    out = torch.empty(n, w, device=DEV, dtype=torch.float32)
    evict = ig._logits_eviction(out)

    def launch(override=None):
        extra = dict(ir_override=override) if override else {}
        return ig._paged_logits_kernel[(batch, cdiv(w, cfg["KEYS_PER_PROG"]))](
            q, weights, key_tiles, scale_tiles, table, table.stride(0), table.shape[1], lens, out, out.stride(0), w,
            H=64, PAGE=PAGE, BLOCK=64, NEXT_N=next_n, TOKENS_PER_REQ=next_n, CLEAN=False, EVICT=evict, num_warps=4,
            **cfg, **extra)
    return launch, out, cfg


for batch, w in [(128, 32768), (32, 32768), (32, 131072), (128, 131072), (128, 4096)]:
    for next_n in (1, 2, 4):
        launch, out, cfg = case(batch, w, next_n, seed=batch + w + next_n)
        k = launch()
        path = os.path.join(PTX_DIR, f"nn{next_n}_{batch}x{w}.ptx")
        open(path, "w").write(patch(k.asm["ptx"]))
        torch.cuda.synchronize()
        plain = out.clone()
        k2 = launch(path)
        torch.cuda.synchronize()
        hinted = sum("cp.async.bulk.tensor" in l and "cache_hint" in l for l in k2.asm["ptx"].splitlines())
        log("checks", shape=[batch, w], next_n=next_n, hinted_tma=hinted, equal=bool(torch.equal(out, plain)))
        for r in range(3):
            t = {}
            for name in (("plain", "hint") if r % 2 == 0 else ("hint", "plain")):
                t[name] = 1000 * graph_ms(lambda: launch(None if name == "plain" else path))
            log("rows", shape=[batch, w], next_n=next_n, round=r, cfg={k: v for k, v in cfg.items()},
                plain_us=round(t["plain"], 2), hint_us=round(t["hint"], 2), speed=round(t["plain"] / t["hint"], 4))

"""A/B: the paged indexer's key reads (TMA) with an L2 evict_first hint, by PTX patched through
Triton's ir_override (Gluon on Triton 3.6 has no TMA cache policy), with the logits stored
evict_last (current) or normally; indexer alone and indexer + top-k (default dispatch), CUDA graphs.
source .device/setup.sh && python3 .ab/keyhint_ab.py"""
import json, math, os, re, sys, time
sys.path.insert(0, "benchmarks")
import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from dsa_kernels import indexer_gluon as ig, indexer_logits, topk
from dsa_kernels.device import num_sms
from dsa_kernels.host_math import cdiv
from graph_timing import graph_ms

DEV, K, PAGE = "cuda", 2048, 64
SMS = num_sms(torch.device(DEV))
OUT = os.environ.get("OUT", ".")
R = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(0), checks=[], rows=[], notes=[])
PTX_DIR = "/tmp/keyhint"
os.makedirs(PTX_DIR, exist_ok=True)


def log(sec, **f):
    R[sec].append(f)
    print(sec, json.dumps(f), flush=True)
    json.dump(R, open(os.path.join(OUT, "keyhint_ab.json"), "w"), indent=1)


def patch(ptx: str) -> str:
    """evict_first on every TMA load: one policy register made at the kernel's start."""
    lines = ptx.splitlines()
    entry = next(i for i, l in enumerate(lines) if ".entry" in l)
    brace = next(i for i in range(entry, len(lines)) if lines[i].strip() == "{")
    last_decl = brace
    while lines[last_decl + 1].strip().startswith((".reg", ".shared", ".local", "//")) or not lines[last_decl + 1].strip():
        last_decl += 1
    n = 0
    for i, l in enumerate(lines):
        if "cp.async.bulk.tensor" in l and "mbarrier::complete_tx::bytes" in l and "cache_hint" not in l:
            l = l.replace("mbarrier::complete_tx::bytes", "mbarrier::complete_tx::bytes.L2::cache_hint", 1)
            assert l.rstrip().endswith("];"), l
            lines[i] = l.rstrip()[:-1] + ", %rdkeyhint;"
            n += 1
    assert n > 0
    lines.insert(last_decl + 1, "\tcreatepolicy.fractional.L2::evict_first.b64 %rdkeyhint, 1.0;")
    lines.insert(brace + 1, "\t.reg .b64 %rdkeyhint;")
    return "\n".join(lines) + "\n"


def case(n, w, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    pages = n * math.ceil(w / PAGE)
    pool = torch.empty(pages + 64, PAGE * 132, dtype=torch.uint8, device=DEV)
    pool[:, : PAGE * 128] = torch.randn(pages + 64, PAGE * 128, device=DEV, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    pool[:, PAGE * 128:] = (torch.rand(pages + 64, PAGE, device=DEV, generator=g) * 0.02 + 0.01).view(torch.uint8)
    table = torch.randperm(pool.shape[0], device=DEV, generator=g)[:pages].view(n, -1).int()
    lens = torch.full((n,), w, device=DEV, dtype=torch.int32)
    q = torch.randn(n, 64, 128, device=DEV, generator=g).to(torch.float8_e4m3fn)
    weights = torch.randn(n, 64, device=DEV, generator=g) * 0.1
    keys, scales = indexer_logits.pool_parts(pool, PAGE)
    key_tiles = TensorDescriptor.from_tensor(keys, [1, 64, 128], ig.KEY_TILE_LAYOUT)
    scale_tiles = TensorDescriptor.from_tensor(scales, [1, 64], ig.SCALE_TILE_LAYOUT)
    cfg = ig.gluon_config(n, w, 1, SMS)
    out = torch.empty(n, w, device=DEV, dtype=torch.float32)

    def launch(evict, override=None):
        extra = dict(ir_override=override) if override else {}
        return ig._paged_logits_kernel[(n, cdiv(w, cfg["KEYS_PER_PROG"]))](
            q, weights, key_tiles, scale_tiles, table, table.stride(0), table.shape[1], lens, out, out.stride(0), w,
            H=64, PAGE=PAGE, BLOCK=64, NEXT_N=1, TOKENS_PER_REQ=1, CLEAN=False, EVICT=evict, num_warps=4, **cfg, **extra)
    return launch, out, lens, table, cfg


def flusher():
    src = torch.empty(1 << 25, device=DEV)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def main():
    flush = flusher()
    t_flush = 1000 * graph_ms(flush)
    shapes = [(32, 32768), (16, 32768), (64, 32768), (128, 32768), (8, 131072), (4, 131072), (32, 131072), (1, 32768),
              (128, 131072)]
    for n, w in shapes:
        launch, out, lens, table, cfg = case(n, w, seed=n + w)
        variants = {}
        for evict in ("evict_last", ""):
            k = launch(evict)
            path = os.path.join(PTX_DIR, f"{n}x{w}_{evict or 'normal'}.ptx")
            open(path, "w").write(patch(k.asm["ptx"]))
            variants[f"logits {evict or 'normal'}"] = (evict, None)
            variants[f"logits {evict or 'normal'}, keys evict_first"] = (evict, path)
        ref_out = None
        for name, (evict, path) in variants.items():
            k = launch(evict, path)
            hinted = sum("cp.async.bulk.tensor" in l and "cache_hint" in l for l in k.asm["ptx"].splitlines())
            torch.cuda.synchronize()
            got = out.clone()
            if ref_out is None:
                ref_out = got
            log("checks", shape=[n, w], variant=name, hinted_tma=hinted, equal=bool(torch.equal(got, ref_out)))

        def pair(fn):
            fn()
            return topk.topk_transform(out, lens, K, topk.TRANSFORM_PAGED, block_table=table, page_size=PAGE)
        names = list(variants)
        flushed_too = (n, w) in ((32, 32768), (8, 131072), (128, 32768))
        for r in range(2):
            for name in (names if r % 2 == 0 else names[::-1]):
                evict, path = variants[name]
                fn = lambda: launch(evict, path)
                row = dict(shape=[n, w], variant=name, round=r, kpp=cfg["KEYS_PER_PROG"])
                row["idx"] = 1000 * graph_ms(fn)
                row["pair"] = 1000 * graph_ms(lambda: pair(fn))
                row["topk_behind"] = row["pair"] - row["idx"]
                row["share"] = row["topk_behind"] / row["idx"]
                if flushed_too:
                    row["idx_flushed"] = 1000 * graph_ms(lambda: (flush(), fn())) - t_flush
                    row["pair_flushed"] = 1000 * graph_ms(lambda: (flush(), pair(fn))) - t_flush
                    row["share_flushed"] = (row["pair_flushed"] - row["idx_flushed"]) / row["idx_flushed"]
                log("rows", **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})


if __name__ == "__main__":
    main()

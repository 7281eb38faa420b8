"""Where an eager call of our three DSA entry points spends host time (thirty-third session).

Each line times one layer of the call alone: the dispatch entry, the module wrapper under it, the
JIT launch with every argument made beforehand, and the compiled kernel's own launcher (Triton's
CompiledKernel[grid], which skips the JIT's binding and cache lookup). Enqueue time of 100 calls
with the GPU left to run behind, median of 7 repeats, µs a call. Then a cProfile (by own time) of
each dispatch entry. Writes $OUT/host_layers.json."""

import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch
import triton

import dsa_kernels
from dsa_kernels import indexer_gluon, indexer_logits, sparse_mla, sparse_mla_gluon, topk, topk_cooperative

dev = torch.device("cuda")
PAGE = 64


def host_us(fn, n=100, repeats=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(runs), 1)


def compiled(jit_fn):
    """The JIT function's compiled kernels (the last one made first)."""
    kernels = []
    for caches in jit_fn.device_caches.values():
        kernels += list(caches[0].values())
    return kernels[::-1]


def runner_call(ck, grid, args_all, args_plain):
    """A call of ck[grid] with every parameter, or with the non-constexpr ones: whichever this Triton's
    launcher takes (the first that runs without error)."""
    for args in (args_all, args_plain):
        try:
            ck[grid](*args)
            torch.cuda.synchronize()
            return lambda: ck[grid](*args)
        except Exception as exc:  # noqa: BLE001 - we report which form this Triton takes
            err = f"{type(exc).__name__}: {exc}"[:200]
    print("compiled runner failed:", err, flush=True)
    return None


res = {"triton": triton.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
lines = {}


def record(name, fn):
    if fn is None:
        return
    lines[name] = host_us(fn)
    print(f"{lines[name]:8.1f} us  {name}", flush=True)


record("empty torch.add", (lambda z: lambda: torch.add(z, 1))(torch.zeros(256, device=dev, dtype=torch.int32)))
record("torch.empty(32, 4096)", lambda: torch.empty(32, 4096, device=dev))

# ---- paged indexer, 32 requests x 4K, next_n 1
pool = torch.zeros(4096, PAGE * 132, dtype=torch.uint8, device=dev)
table = torch.arange(32 * 64, device=dev, dtype=torch.int32).view(32, 64)
q = torch.randn(32, 64, 128, device=dev).to(torch.float8_e4m3fn)
w = torch.randn(32, 64, device=dev)
ctx = torch.full((32, 1), 4096, dtype=torch.int32, device=dev)
lens = ctx.reshape(-1)
record("indexer: dispatch auto (DeepGEMM)", lambda: dsa_kernels.paged_indexer_logits(
    q, w, pool, table, ctx, page_size=PAGE, max_context_len=4096, clean_logits=False))
record("indexer: dispatch ours", lambda: dsa_kernels.paged_indexer_logits(
    q, w, pool, table, ctx, page_size=PAGE, max_context_len=4096, clean_logits=False, backend="ours"))
record("indexer: indexer_logits.paged_indexer_logits", lambda: indexer_logits.paged_indexer_logits(
    q, w, pool, table, ctx, PAGE, 4096, 1, False))
keys, scales = indexer_logits.pool_parts(pool, PAGE)
cfg = indexer_logits.gluon_paged_config(dev, 32, 4096, 1, PAGE)
record("indexer: indexer_gluon.paged_indexer_logits", lambda: indexer_gluon.paged_indexer_logits(
    q, w, keys, scales, table, lens, 4096, 1, False, cfg))
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

record("indexer: TensorDescriptor.from_tensor", lambda: TensorDescriptor.from_tensor(
    keys, [1, 64, 128], indexer_gluon.KEY_TILE_LAYOUT))
key_tiles = TensorDescriptor.from_tensor(keys, [1, 64, 128], indexer_gluon.KEY_TILE_LAYOUT)
scale_tiles = TensorDescriptor.from_tensor(scales, [1, 64], indexer_gluon.SCALE_TILE_LAYOUT)
out = torch.empty(32, 4096, device=dev)
grid = (32, triton.cdiv(4096, cfg["KEYS_PER_PROG"]))
plain = [q, w, key_tiles, scale_tiles, table, table.stride(0), table.shape[1], lens, out, out.stride(0), 4096]
consts = dict(H=64, PAGE=PAGE, BLOCK=64, NEXT_N=1, TOKENS_PER_REQ=1, CLEAN=False,
              EVICT=indexer_gluon._logits_eviction(out), num_warps=4, **cfg)
record("indexer: JIT launch, arguments made", lambda: indexer_gluon._paged_logits_kernel[grid](*plain, **consts))
ck = compiled(indexer_gluon._paged_logits_kernel)[0]
names = indexer_gluon._paged_logits_kernel.arg_names
every = plain + [consts[a] for a in names[len(plain):] if a in consts]
record("indexer: compiled launcher", runner_call(ck, grid, every, plain))

# ---- top-k: the engine's decode shape (paged, 32 rows of 4K) and a long one (ragged, 8 x 32K)
for rows, width, method in ((32, 4096, "paged"), (8, 32768, "ragged")):
    logits = torch.randn(rows, width, device=dev)
    rl = torch.full((rows,), width, dtype=torch.int32, device=dev)
    offs = torch.zeros(rows, dtype=torch.int32, device=dev)
    bt = torch.arange(rows * (width // PAGE), device=dev, dtype=torch.int32).view(rows, -1)
    tag = f"top-k {method} {rows} x {width // 1024}K"
    kw = dict(block_table=bt, page_size=PAGE) if method == "paged" else dict(offsets=offs)
    record(f"{tag}: dispatch", lambda: dsa_kernels.topk_transform(logits, rl, 2048, method, **kw))
    tr = topk.TRANSFORM_PAGED if method == "paged" else topk.TRANSFORM_RAGGED
    tkw = dict(block_table=bt, page_size=PAGE) if method == "paged" else dict(offsets=offs)
    record(f"{tag}: topk.topk_transform", lambda: topk.topk_transform(logits, rl, 2048, tr, **tkw))
    parts = topk_cooperative.parts_per_row(rows, width, torch.cuda.get_device_properties(dev).multi_processor_count)
    o = torch.empty(rows, 2048, device=dev, dtype=torch.int32)
    args = (logits, rl, None, 2048, parts, o, tr, bt if method == "paged" else None, PAGE, 1,
            offs if method == "ragged" else None)
    record(f"{tag}: cooperative_topk (parts {parts})", lambda: topk_cooperative.cooperative_topk(*args))
    record(f"{tag}: torch.empty x5 (its scratch and output)", lambda: [torch.empty(rows, 2, parts, 64, device=dev,
                                                                                   dtype=torch.int32) for _ in range(5)])

# ---- sparse MLA decode, FP8 pool, 32 rows x 64 heads, top-k 2048
mla_pool = torch.zeros(8192, 656, dtype=torch.uint8, device=dev)
qa = torch.randn(32, 64, 576, device=dev).bfloat16()
idx = torch.randint(0, 8192, (32, 2048), device=dev, dtype=torch.int32)
record("mla: dispatch auto (FlashMLA)", lambda: dsa_kernels.sparse_mla_decode(qa, mla_pool, idx, 0.1))
record("mla: dispatch triton", lambda: dsa_kernels.sparse_mla_decode(qa, mla_pool, idx, 0.1, backend="triton"))
record("mla: sparse_mla.sparse_mla", lambda: sparse_mla.sparse_mla(qa, mla_pool, idx, 0.1))
cfg = sparse_mla.mla_config(32, 64, 2048)
split = cfg["SPLIT"]
res["mla_split"] = split
views = (mla_pool.view(torch.float8_e4m3fn), mla_pool.view(torch.float32), mla_pool.view(torch.bfloat16))
part = torch.empty(32, split, 64, 512, device=dev)
part_lse = torch.empty(32, split, 64, device=dev)
record("mla: gluon launch(), arguments made", lambda: sparse_mla_gluon.launch(
    qa, views, 656, 8192, idx, 2048, part, part_lse, 0.1, 2048 // split, split, True))
record("mla: kv_pool.view x3", lambda: (mla_pool.view(torch.float8_e4m3fn), mla_pool.view(torch.float32),
                                        mla_pool.view(torch.bfloat16)))
record("mla: q[rows] slices x4 (attend's)", lambda: (qa[0:32], idx[0:32], part[0:32], part_lse[0:32]))
record("mla: mla_config", lambda: sparse_mla.mla_config(32, 64, 2048))

# ---- cProfile of each dispatch entry, by own time
tk_logits = torch.randn(32, 4096, device=dev)
tk_lens = torch.full((32,), 4096, dtype=torch.int32, device=dev)
tk_bt = torch.arange(32 * 64, device=dev, dtype=torch.int32).view(32, 64)
profiles = {
    "top-k paged 32 x 4K": lambda: dsa_kernels.topk_transform(tk_logits, tk_lens, 2048, "paged", block_table=tk_bt,
                                                              page_size=PAGE),
    "indexer ours": lambda: dsa_kernels.paged_indexer_logits(q, w, pool, table, ctx, page_size=PAGE,
                                                             max_context_len=4096, clean_logits=False, backend="ours"),
    "mla triton": lambda: dsa_kernels.sparse_mla_decode(qa, mla_pool, idx, 0.1, backend="triton"),
}
for name, fn in profiles.items():
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(28)
    print(f"==== cProfile {name} (200 calls), by own time\n" + s.getvalue()[:7000], flush=True)

res["us_a_call"] = lines
with open(os.path.join(os.environ.get("OUT", "."), "host_layers.json"), "w") as f:
    json.dump(res, f, indent=1)

"""The half-gather bound and the committed kernel, each also launched as clusters of two CTAs (a
row's two head blocks; no coupling, the nineteenth session's `ve` launch): what the cluster launch
costs on top of the bound. FP8 pool, 128 heads, alternating CUDA-graph replays, best of three."""
import importlib, json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla, sparse_mla_gluon

sys.path.insert(0, ".ab/halfk")
half = importlib.import_module("dsa_kernels_old.sparse_mla")
half_gluon = importlib.import_module("dsa_kernels_old.sparse_mla_gluon")
CLUSTER = [False]


def launch_pairs(kernel_fn, programs, args, constexprs):
    """The nineteenth session's launch (cta-pairs.patch): compiled for one CTA, launched with
    num_ctas 2 in the packed metadata, so that programs 2 i and 2 i + 1 form a cluster."""
    kernel = kernel_fn.run(*args, grid=(programs,), warmup=True, **constexprs)
    kernel._init_handles()
    num_warps, _, shared = kernel.packed_metadata
    names = kernel_fn.arg_names
    values = list(args) + [constexprs[name] for name in names[len(args):]]
    stream = torch.cuda.current_stream().cuda_stream
    kernel.run(programs // 2, 1, 1, stream, kernel.function, (num_warps, 2, shared), None, None, None, *values)


def wrap(gmod):
    orig = gmod.launch

    def launch(q, views, stride_kv, num_slots, indices, topk, part, part_lse, out, lse, scale_log2, keys_per_split,
               split, fp8, merge):
        if not CLUSTER[0]:
            return orig(q, views, stride_kv, num_slots, indices, topk, part, part_lse, out, lse, scale_log2,
                        keys_per_split, split, fp8, merge)
        assert split == 1
        n, heads, _ = q.shape
        args = [q, q.stride(0), q.stride(1), *views, stride_kv, num_slots, indices, indices.stride(0), topk, part,
                part_lse, scale_log2, keys_per_split, split, part, part, part_lse]
        launch_pairs(gmod._sparse_mla_kernel, n * heads // 64, args,
                     dict(H=heads, FP8=fp8, PARTIAL=False, MERGE=0, num_warps=gmod.NUM_WARPS))
        return False
    gmod.launch = launch


wrap(sparse_mla_gluon)
wrap(half_gluon)
SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))


def clustered(fn):
    def run():
        CLUSTER[0] = True
        try:
            return fn()
        finally:
            CLUSTER[0] = False
    return run


rows = []
for n in (128, 64, 100):
    q = torch.randn(n, 128, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    committed = lambda: sparse_mla.sparse_mla(q, pool, idx, SCALE)
    halfg = lambda: half.sparse_mla(q, pool, idx, SCALE)
    fns = dict(committed=committed, committed_clusters=clustered(committed), half_gather=halfg,
               half_gather_clusters=clustered(halfg), flashmla=lambda: dispatch._flashmla_decode(q, pool, idx, SCALE))
    a = committed()[0].clone()
    b = fns["committed_clusters"]()[0].clone()
    torch.cuda.synchronize()
    r = dict(heads=128, n=n, clusters_equal=bool(torch.equal(a, b)))
    for i in range(3):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            r.setdefault(name, []).append(round(graph_ms(fns[name]) * 1e3, 2))
    best = {k: min(r[k]) for k in fns}
    r.update({f"{k}_vs_fm": round(best["flashmla"] / best[k], 3) for k in fns if k != "flashmla"})
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "half_cluster_ab.json"), "w"), indent=1)

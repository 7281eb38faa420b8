"""Which compiles of our decode kernels, over batch sizes 1..48, differ only in Triton's integer
specialization (same constexprs): those would be compiles a do_not_specialize could spare."""
import collections
import json
import sys

import torch
import triton

import dsa_kernels
from dsa_kernels import cache_store

log = []


def hook(**kw):
    c, jf = kw["compile"], kw["fn"].jit_function
    declared = {p.name for p in jf.params if p.is_constexpr}

    def name(k):
        return jf.params[k[0]].name if isinstance(k, tuple) else k

    consts = {name(k): v for k, v in c["constants"].items()}
    fixed = sorted((k, str(v)) for k, v in consts.items() if k in declared)
    varying = sorted((k, str(v)) for k, v in consts.items() if k not in declared)
    attrs = sorted((name(k), str(v)) for k, v in c["configs"][0].items())
    opts = (c["num_warps"], c["num_ctas"], c["num_stages"], c["launch_cooperative_grid"])
    log.append(dict(fn=kw["fn"].name, fixed=str((fixed, opts, sorted((k, "i32" if v == "constexpr" and k not in declared else str(v))
                                                         for k, v in c["signature"].items()))),
                    varying=str((varying, attrs))))
    return None


triton.knobs.runtime.jit_cache_hook = hook
torch.manual_seed(0)
SLOTS, PAGE = 262144, 64
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
cache_store.store_mla(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
ipool = torch.zeros(SLOTS // PAGE, PAGE * 132, dtype=torch.uint8, device="cuda")
cache_store.store_index_keys(ipool, torch.randn(SLOTS, 128, device="cuda"), torch.arange(SLOTS, device="cuda"), PAGE)
what = sys.argv[1]
for batch in range(1, 49):
    if what == "mla":
        for heads in (64, 128):
            q = torch.randn(batch, heads, 576, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, SLOTS, (batch, 2048), device="cuda").int()
            dsa_kernels.sparse_mla_decode(q, pool, idx, 576 ** -0.5, backend="ours")
    else:
        ctx = 3000 + 37 * batch
        width = -(-ctx // PAGE)
        table = torch.randint(0, SLOTS // PAGE, (batch, width), device="cuda").int()
        lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
        q = torch.randn(batch, 64, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(batch, 64, device="cuda") * 0.1
        logits = dsa_kernels.paged_indexer_logits(q, w, ipool, table, lens, page_size=PAGE, max_context_len=ctx,
                                                  clean_logits=False, backend="ours")
        dsa_kernels.topk_transform(logits, lens, 2048, "paged", block_table=table, page_size=PAGE)
    torch.cuda.synchronize()
    print(batch, len(log), flush=True)


groups = collections.defaultdict(set)
for e in log:
    groups[(e["fn"], e["fixed"])].add(str(e["varying"]))
print("compiles", len(log), "specialization-only extras", sum(len(v) - 1 for v in groups.values()))
for (fn, _), keys in groups.items():
    if len(keys) > 1:
        print(fn, len(keys))
        for k in keys:
            print("   ", k[:900])

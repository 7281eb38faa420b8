"""Where sparse MLA decode's time goes at 1-8 rows: the whole op at a forced split, the Gluon kernel
alone (its partials, no merge), and the merge kernel alone (on those partials), against FlashMLA.
FP8 pool, top-k 2048, CUDA graphs, best of three. Writes $OUT/small_batch_parts.json."""
import json, os, sys, time

sys.path.insert(0, "benchmarks")
import torch
from graph_timing import graph_ms
from dsa_kernels import dispatch, sparse_mla
from dsa_kernels.sparse_mla import sparse_mla_gluon, merge_config, _merge_splits_kernel, _LOG2E
from dsa_kernels.host_math import cdiv, next_power_of_2

DEV, SCALE, SLOTS = "cuda", 576 ** -0.5, 262144
torch.manual_seed(0)
kv = torch.zeros(SLOTS, 656, dtype=torch.uint8, device=DEV)
dispatch.store_mla_kv(kv, torch.randn(SLOTS, 512, device=DEV), torch.randn(SLOTS, 64, device=DEV),
                      torch.arange(SLOTS, device=DEV))
views = (kv.view(torch.float8_e4m3fn), kv.view(torch.float32), kv.view(torch.bfloat16))
rows = []
for heads, n, split in ((128, 1, 32), (64, 2, 32), (128, 2, 32), (128, 2, 16), (128, 4, 16), (128, 4, 8),
                        (64, 4, 16), (64, 8, 16), (64, 8, 8), (128, 8, 8)):
    q = torch.randn(n, heads, 576, device=DEV).to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device=DEV).int()
    cfg = dict(sparse_mla.mla_config(n, heads, 2048), SPLIT=split)
    part = torch.empty(n, split, heads, 512, device=DEV, dtype=torch.float32)
    part_lse = torch.empty(n, split, heads, device=DEV, dtype=torch.float32)
    out = torch.empty(n, heads, 512, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(n, heads, device=DEV, dtype=torch.float32)
    kps = cdiv(cdiv(2048, split), 64) * 64
    merge = merge_config(split)
    fns = dict(
        op=lambda: sparse_mla.sparse_mla(q, kv, idx, SCALE, config=cfg, gluon=True),
        kernel=lambda: sparse_mla_gluon.launch(q, views, 656, SLOTS, idx, 2048, part, part_lse, out, lse,
                                               SCALE * _LOG2E, kps, split, True, merge=False),
        merge=lambda: _merge_splits_kernel[(n * heads * (512 // merge["BLOCK_D"]),)](
            part, part_lse, out, lse, split, H=heads, SPLITS=next_power_of_2(split), **merge),
        flashmla=lambda: dispatch._flashmla_decode(q, kv, idx, SCALE))
    times = {k: [] for k in fns}
    for _ in range(3):
        for k, fn in fns.items():
            times[k].append(round(graph_ms(fn) * 1e3, 2))
    best = {k: min(v) for k, v in times.items()}
    r = dict(heads=heads, n=n, split=split, programs=n * heads // 64 * split, us=best,
             gap=round(best["op"] - best["kernel"] - best["merge"], 2))
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "small_batch_parts.json"), "w"), indent=1)

"""The committed kernels (a copy in .ab/s45/oldk) against the working tree's (do_not_specialize on
step-varying integers, padded logits rows) at the benchmark's shapes: CUDA graphs, alternating
rounds, µs; outputs compared bit for bit."""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".ab/s45")
from graph_timing import alternating_us  # noqa: E402
from indexer_bench import random_index_pool  # noqa: E402

import dsa_kernels  # noqa: E402
import oldk  # noqa: E402
from dsa_kernels import indexer_logits as new_ix  # noqa: E402
from oldk import indexer_logits as old_ix  # noqa: E402

DEV, PAGE, K = "cuda", 64, 2048
torch.manual_seed(0)
res = {"gpu": torch.cuda.get_device_name(), "rows": []}
for n, w, nn in [(32, 32768, 1), (128, 32768, 1), (32, 4096, 1), (128, 4096, 1), (32, 32768, 2), (32, 131072, 1)]:
    b = n
    pages = b * w // PAGE
    pool = random_index_pool(pages + 64, PAGE, DEV)
    table = torch.randperm(pool.shape[0], device=DEV)[:pages].view(b, -1).int()
    lens = torch.full((b * nn,), w, device=DEV, dtype=torch.int32)
    q = torch.randn(b * nn, 64, 128, device=DEV).to(torch.float8_e4m3fn)
    weights = torch.randn(b * nn, 64, device=DEV) * 0.1
    fns = {f"{tag} indexer": (lambda m=m: m.paged_indexer_logits(q, weights, pool, table, lens, PAGE, w, nn,
                                                                  clean_logits=False)) for tag, m in (("old", old_ix), ("new", new_ix))}
    a, c = fns["old indexer"](), fns["new indexer"]()
    same_ix = bool(torch.equal(a, c))
    if nn == 1:
        for tag, m in (("old", oldk), ("new", dsa_kernels)):
            fns[f"{tag} topk"] = (lambda m=m, lg=(a if tag == "old" else c): m.topk_transform(
                lg, lens, K, "paged", block_table=table, page_size=PAGE))
        same_tk = bool(torch.equal(fns["old topk"](), fns["new topk"]()))
    else:
        same_tk = None
    times = alternating_us(fns, rounds=3)
    row = dict(n=n, w=w, next_n=nn, same_indexer=same_ix, same_topk=same_tk, best_us={k: min(v) for k, v in times.items()},
               times_us=times)
    print(json.dumps(row), flush=True)
    res["rows"].append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)

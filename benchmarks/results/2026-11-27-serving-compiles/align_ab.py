"""What the engine's logits widths cost: the top-k and the paged indexer with a row stride that is
a multiple of 16 (as at the benchmarks' 4K/32K/128K) against one that is not (an engine's max
context length, 15 times in 16), and against rows padded to a multiple of 16.
CUDA graphs, alternating rounds, µs; outputs compared."""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
from graph_timing import alternating_us  # noqa: E402
from indexer_bench import random_index_pool  # noqa: E402

import dsa_kernels  # noqa: E402
from dsa_kernels import indexer_logits  # noqa: E402

DEV, PAGE, K = "cuda", 64, 2048
torch.manual_seed(0)
res = {"gpu": torch.cuda.get_device_name(), "rows": []}
for n, w in [(32, 32768), (128, 32768), (32, 131072), (32, 4096), (128, 4096), (8, 32768)]:
    m = w - 3  # the engine's max context: not a multiple of 16
    pages = n * w // PAGE
    pool = random_index_pool(pages + 64, PAGE, DEV)
    table = torch.randperm(pool.shape[0], device=DEV)[:pages].view(n, -1).int()
    lens = torch.full((n,), m, device=DEV, dtype=torch.int32)
    q = torch.randn(n, 64, 128, device=DEV).to(torch.float8_e4m3fn)
    weights = torch.randn(n, 64, device=DEV) * 0.1
    # the indexer at max_context_len m (stride m) and w (stride w, rows past m unused)
    ix = {f"indexer stride {L}": (lambda L=L: indexer_logits.paged_indexer_logits(
        q, weights, pool, table, lens, PAGE, L, 1, clean_logits=False)) for L in (m, w)}
    a, b = ix[f"indexer stride {m}"](), ix[f"indexer stride {w}"]()
    same_ix = bool(torch.equal(a, b[:, :m]))
    logits = a.clone()
    padded = torch.empty(n, w, device=DEV)[:, :m]
    padded.copy_(logits)
    tk = {f"topk stride {lg.stride(0)}": (lambda lg=lg: dsa_kernels.topk_transform(
        lg, lens, K, "paged", block_table=table, page_size=PAGE)) for lg in (logits, padded)}
    outs = [fn() for fn in tk.values()]
    same_tk = bool(torch.equal(outs[0], outs[1]))
    times = alternating_us({**ix, **tk}, rounds=3)
    best = {k: min(v) for k, v in times.items()}
    row = dict(n=n, w=w, m=m, same_indexer=same_ix, same_topk=same_tk, best_us=best, times_us=times)
    print(json.dumps(row), flush=True)
    res["rows"].append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)

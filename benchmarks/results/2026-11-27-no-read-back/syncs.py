"""Where a forward's host syncs come from: torch's sync debug mode, each warning's stack."""
import collections
import sys
import traceback
import warnings

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.models import load_model

path = sys.argv[1]
model, info = load_model(path, torch.bfloat16, "cuda")
cache = KVCache(model.config, 64, 16, dtype=torch.bfloat16, kv_cache_dtype="fp8", mtp_has_indexer=info.mtp_has_indexer,
                device="cuda")
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(2, 120000, (n,), generator=g).tolist() for n in (20, 45, 70, 100)]
pages = [cache.allocator.allocate(pages_needed(len(p) + 8, 16)) for p in prompts]
seen = collections.Counter()


def show(message, category, filename, lineno, file=None, line=None):
    stack = [f for f in traceback.extract_stack()[:-1]
             if "/torch/" not in f.filename and "warnings.py" not in f.filename]
    where = " <- ".join(f"{f.filename.split('/')[-1]}:{f.lineno}:{f.name}" for f in reversed(stack[-6:]))
    seen[where] += 1


def run(mode, ids, prefix, name):
    batch = ForwardBatch.build(mode, ids, prefix, pages, 16, "cuda", all_logits=mode is ForwardMode.TARGET_VERIFY)
    model(batch, cache)  # first call: lazy init
    torch.cuda.synchronize()
    seen.clear()
    old = warnings.showwarning
    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        model(batch, cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = old
    print(f"== {name}: {sum(seen.values())} syncs", flush=True)
    for where, n in seen.most_common():
        print(f"  {n:4d}  {where}")


with torch.no_grad():
    run(ForwardMode.EXTEND, prompts, [0] * 4, "extend")
    run(ForwardMode.DECODE, [[5]] * 4, [len(p) for p in prompts], "decode")
    run(ForwardMode.TARGET_VERIFY, [[5, 6]] * 4, [len(p) + 1 for p in prompts], "verify next_n 2")

"""The EXTEND forward's one read back: its full stack (torch frames too)."""
import sys
import traceback
import warnings

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.models import load_model

model, info = load_model(sys.argv[1], torch.bfloat16, "cuda")
cache = KVCache(model.config, 64, 16, dtype=torch.bfloat16, kv_cache_dtype="fp8", mtp_has_indexer=info.mtp_has_indexer,
                device="cuda")
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(2, 120000, (n,), generator=g).tolist() for n in (20, 45, 70, 100)]
pages = [cache.allocator.allocate(pages_needed(len(p) + 8, 16)) for p in prompts]


def show(message, category, filename, lineno, file=None, line=None):
    print("---- sync:", message)
    print("".join(traceback.format_stack()[:-1][-14:]))


with torch.no_grad():
    batch = ForwardBatch.build(ForwardMode.EXTEND, prompts, [0] * 4, pages, 16, "cuda")
    model(batch, cache)
    torch.cuda.synchronize()
    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    model(batch, cache)
    torch.cuda.set_sync_debug_mode("default")

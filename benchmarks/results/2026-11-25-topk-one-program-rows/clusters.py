"""How many clusters of the top-k kernel fit the GPU at once, per shape (programs a row, warps)."""
import torch
from dsa_kernels import topk_cooperative as tc
orig = tc._max_active_clusters
def show(function, parts, threads, smem):
    got = orig(function, parts, threads, smem)
    print(dict(parts=parts, threads=threads, smem=smem, max_active_clusters=got), flush=True)
    return got
tc._max_active_clusters = show
sms = torch.cuda.get_device_properties(0).multi_processor_count
for rows, width in [(32, 32768), (64, 32768), (32, 131072), (16, 131072), (16, 32768), (8, 32768), (4, 32768), (33, 32768)]:
    parts = tc.device_parts(rows, width, sms)
    logits = torch.randn(rows, width, device="cuda"); lens = torch.full((rows,), width, device="cuda", dtype=torch.int32)
    out = torch.empty(rows, 2048, device="cuda", dtype=torch.int32)
    ok = tc.cooperative_topk(logits, lens, None, 2048, parts, out, 0, None, 1, 1, None)
    from dsa_kernels import reference
    print(dict(rows=rows, width=width, parts=parts, launched=ok,
               exact=bool(torch.equal(out, reference.topk_positions_ref(logits, lens, 2048)))), flush=True)

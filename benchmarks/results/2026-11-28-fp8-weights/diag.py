import torch
from dsa_kernels import fp8_gemm, reference, cache_store
torch.manual_seed(0)
x = torch.randn(512, 7168, device="cuda", dtype=torch.bfloat16)
a, s = fp8_gemm.quantize_act(x)
ra, rs = reference.quantize_act_ref(x.cpu())
print("scale mismatches", (s.cpu() != rs).sum().item(), "of", rs.numel())
bad = (a.view(torch.uint8).cpu() != ra.view(torch.uint8)).nonzero()
print("value mismatches", len(bad), "of", ra.numel())
xf = x.float().cpu()
for r, c in bad[:12].tolist():
    sc = rs[r, c // 128].item()
    v32 = (xf[r, c] / rs[r, c // 128]).item()
    print(r, c, "x", xf[r, c].item(), "scale", sc, "v", repr(v32), "gpu", a[r, c].float().item(), "cpu", ra[r, c].float().item())
# the same question for the index-key store
pool_g = torch.zeros(64, 64 * 132, dtype=torch.uint8, device="cuda")
keys = torch.randn(4096, 128, device="cuda") * 5
slots = torch.arange(4096, device="cuda")
cache_store.store_index_keys(pool_g, keys, slots, 64)
pool_c = torch.zeros(64, 64 * 132, dtype=torch.uint8)
reference.store_index_keys_ref(pool_c, keys.cpu(), slots.cpu(), 64)
print("index store byte mismatches", (pool_g.cpu() != pool_c).sum().item(), "of", pool_c.numel())

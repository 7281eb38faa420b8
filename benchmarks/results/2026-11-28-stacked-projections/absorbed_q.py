"""The absorbed MLA query: torch.cat of the per-head GEMM's latent and a RoPE kernel's output,
against the RoPE kernel writing behind the latent (dsa_kernels.rope(..., prefix=)), CUDA graphs."""
import json, sys
sys.path.insert(0, "benchmarks")
import torch
import dsa_kernels
from graph_timing import graph_ms

rows = []
for t in (1, 32, 96, 128):
    g = torch.Generator(device="cuda").manual_seed(t)
    q_nope = torch.randn(t, 128, 128, device="cuda", generator=g).bfloat16()
    w_uk = torch.randn(128, 128, 512, device="cuda", generator=g).bfloat16() * 0.05
    q_rope = torch.randn(t, 128, 192, device="cuda", generator=g).bfloat16()[..., 128:]
    angles = torch.arange(t, device="cuda")[:, None] * torch.rand(32, device="cuda", generator=g)
    cos, sin = angles.cos(), angles.sin()

    def apart():
        latent = torch.einsum("thd,hdc->thc", q_nope, w_uk)
        return torch.cat([latent, dsa_kernels.rope(q_rope, cos, sin, True)], dim=-1)

    def fused():
        latent = torch.einsum("thd,hdc->thc", q_nope, w_uk)
        return dsa_kernels.rope(q_rope, cos, sin, True, prefix=latent)

    row = dict(rows=t, equal=bool(torch.equal(apart(), fused())),
               apart_us=round(graph_ms(apart) * 1e3, 2), fused_us=round(graph_ms(fused) * 1e3, 2))
    row["gain"] = round(row["apart_us"] / row["fused_us"], 3)
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)

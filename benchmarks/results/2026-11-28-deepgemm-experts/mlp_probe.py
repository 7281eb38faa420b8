"""Session 57: where the stacked shared-expert MLP loses at 1024 rows."""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import dsa_kernels  # noqa: E402
from graph_timing import graph_ms  # noqa: E402
from bench_fp8_gemm import _random_fp8, _cycling  # noqa: E402

out = []
for m in (128, 512, 1024, 2048):
    x = torch.randn(m, 7168, device="cuda", dtype=torch.bfloat16)
    row = dict(m=m)
    for name, n, k in (("n2048", 2048, 7168), ("n4096", 4096, 7168), ("down", 7168, 2048)):
        copies = max(1, -(-(256 << 20) // (n * k)))
        w, s = _random_fp8(n, k, copies)
        xi = x if k == 7168 else torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        a, sa = dsa_kernels.quantize_act(xi)
        row[name + "_linear_us"] = round(graph_ms(_cycling(lambda i: dsa_kernels.fp8_linear(xi, w[i], s[i]), copies)) * 1e3, 2)
        row[name + "_quantized_us"] = round(graph_ms(_cycling(lambda i: dsa_kernels.fp8_linear_quantized(a, sa, w[i], s[i]), copies)) * 1e3, 2)
    h = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    row["silu_mul_quantize_us"] = round(graph_ms(lambda: dsa_kernels.silu_mul_quantize(h)) * 1e3, 2)
    row["torch_silu_mul_us"] = round(graph_ms(lambda: torch.nn.functional.silu(h[:, :2048]) * h[:, 2048:]) * 1e3, 2)
    a, sa = dsa_kernels.silu_mul_quantize(h)
    row["act_scale_strides"] = list(sa.stride())
    print(json.dumps(row), flush=True)
    out.append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)

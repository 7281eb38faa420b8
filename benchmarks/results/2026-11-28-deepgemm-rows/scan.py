"""Session 58: DeepGEMM's fp8_gemm_nt whole against on two row halves, rows 64..2560 step 64,
over V3.2 and GLM-5 dense FP8 shapes (the one-wave cliff's extent)."""
import json
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import dsa_kernels  # noqa: E402
from dsa_kernels import dispatch  # noqa: E402
from graph_timing import graph_ms  # noqa: E402
from bench_fp8_gemm import _random_fp8, _cycling  # noqa: E402

SHAPES = {"v32_shared_gate_up": (4096, 7168), "v32_qkv_a": (2240, 7168), "glm_shared_gate_up": (4096, 6144),
          "glm_qkv_a": (2752, 6144), "v32_shared_down": (7168, 2048), "glm_shared_down": (6144, 2048),
          "glm_o_proj": (6144, 16384), "glm_q_heads": (20480, 2048)}
t0 = time.time()
dg = dispatch._library("deep_gemm")
out = []
for name, (n, k) in SHAPES.items():
    copies = max(1, -(-(128 << 20) // (n * k)))
    w, s = _random_fp8(n, k, copies)
    a_all, sa_all = dsa_kernels.quantize_act(torch.randn(2560, k, device="cuda", dtype=torch.bfloat16))
    for m in range(64, 2561, 64):
        if time.time() - t0 > 540:
            break
        a, sa = a_all[:m], sa_all[:m]
        res = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        h = (m // 2 + 63) // 64 * 64

        def whole(i):
            dg.fp8_gemm_nt((a, sa), (w[i], s[i]), res)

        def halves(i):
            dg.fp8_gemm_nt((a[:h], sa[:h]), (w[i], s[i]), res[:h])
            dg.fp8_gemm_nt((a[h:], sa[h:]), (w[i], s[i]), res[h:])

        row = dict(shape=name, m=m, n=n, k=k)
        for key, fn in (("dg", whole), ("halves", halves)):
            row[key] = round(graph_ms(_cycling(fn, copies), rep_ms=10, replays=5) * 1e3, 2)
        row["tflops"] = round(2 * m * n * k / row["dg"] / 1e6, 1)
        print(json.dumps(row), flush=True)
        out.append(row)
    del w, s
    json.dump(out, open(sys.argv[1], "w"))
print("done", round(time.time() - t0), flush=True)

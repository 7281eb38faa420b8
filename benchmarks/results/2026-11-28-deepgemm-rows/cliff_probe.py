"""Session 58: DeepGEMM's fp8_gemm_nt against ours (and DeepGEMM on M halves) over the engine's
dense FP8 shapes of DeepSeek-V3.2 and prefill row counts; with DG_PRINT_CONFIGS its choices."""
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
import dsa_kernels  # noqa: E402
from dsa_kernels import dispatch  # noqa: E402
from graph_timing import graph_ms  # noqa: E402
from bench_fp8_gemm import _random_fp8, _cycling  # noqa: E402

SHAPES = {"shared_gate_up": (4096, 7168), "shared_down": (7168, 2048), "qkv_a": (2240, 7168),
          "o_proj": (7168, 16384), "q_heads": (32768, 1536), "dense_gate_up": (36864, 7168),
          "dense_down": (7168, 18432)}
ROWS = (256, 512, 768, 1024, 1280, 1536, 2048, 3072, 4096)

if len(sys.argv) > 2 and sys.argv[2] == "configs":  # one call a shape, configs printed
    for name, (n, k) in SHAPES.items():
        w, s = _random_fp8(n, k, 1)
        for m in ROWS:
            a, sa = dsa_kernels.quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
            print(f"SHAPE {name} m={m} n={n} k={k}", flush=True)
            dispatch._deepgemm_gemm(a, sa, w[0], s[0])
            torch.cuda.synchronize()
    sys.exit(0)

t0 = time.time()
cfg = subprocess.run([sys.executable, __file__, "-", "configs"], env={**os.environ, "DG_PRINT_CONFIGS": "1"},
                     capture_output=True, text=True, timeout=240)
open(sys.argv[1].replace(".json", "_configs.txt"), "w").write(cfg.stdout + cfg.stderr[-4000:])
print("configs pass", round(time.time() - t0, 1), "s", flush=True)
dg = dispatch._library("deep_gemm")
out = []
for name, (n, k) in SHAPES.items():
    copies = max(1, -(-(256 << 20) // (n * k)))
    w, s = _random_fp8(n, k, copies)
    for m in ROWS:
        if time.time() - t0 > 500:
            break
        a, sa = dsa_kernels.quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        res = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        h = (m // 2 + 63) // 64 * 64

        def halves(i):
            dg.fp8_gemm_nt((a[:h], sa[:h]), (w[i], s[i]), res[:h])
            dg.fp8_gemm_nt((a[h:], sa[h:]), (w[i], s[i]), res[h:])

        row = dict(shape=name, m=m, n=n, k=k)
        for key, fn in (("dg", lambda i: dsa_kernels.fp8_linear_quantized(a, sa, w[i], s[i], backend="deepgemm")),
                        ("ours", lambda i: dsa_kernels.fp8_linear_quantized(a, sa, w[i], s[i], backend="triton")),
                        ("dg_halves", halves)):
            row[key + "_us"] = round(graph_ms(_cycling(fn, copies)) * 1e3, 2)
        row["dg_tflops"] = round(2 * m * n * k / row["dg_us"] / 1e6, 1)
        got = dsa_kernels.fp8_linear_quantized(a, sa, w[0], s[0], backend="deepgemm")
        halves(0)
        row["halves_equal"] = bool(torch.equal(got, res))
        print(json.dumps(row), flush=True)
        out.append(row)
    del w, s
json.dump(out, open(sys.argv[1], "w"), indent=1)

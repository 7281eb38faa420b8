#!/bin/bash
# Session 50, call 1: an H200 runs issue 4's call5 (the rows no H200 has measured); an H100 the FP8-weight GPU tests and benchmarks.
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; exit; fi
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
echo "== tests"; date
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemm.py tests/test_fp8_weights.py 2>&1 | grep -v "^  " | tail -30
echo "== gemm"; date
timeout 200 python3 benchmarks/bench_fp8_gemm.py --rows 1,4,32,256,4096 --json $OUT/fp8_gemm.json 2>&1 | grep -v '^{"date' | cut -c1-420
echo "== engine batch 4"; date
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
timeout 150 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 4 --prompt-len 2112 --steps 16 --rounds 3 \
  --backends graph --fp8-weights keep,dequantize --json "$OUT/engine_fp8_b4.json" 2>&1 | grep -v '^{' | tail -10
date

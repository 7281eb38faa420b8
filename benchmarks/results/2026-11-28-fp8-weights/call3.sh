#!/bin/bash
# Session 50, call 3: FP8-weight GPU tests again, engine A/B (kept vs dequantized) at batch 1 / 4 / 32.
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
echo "== tests"; date
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemm.py tests/test_fp8_weights.py tests/test_moe.py > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -12
echo "== checkpoint"; date
[ -d /tmp/v32 ] || timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
for b in 1 4 32; do
  echo "== engine batch $b"; date
  timeout 150 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch $b --prompt-len 2112 --steps 16 --rounds 3 \
    --backends graph --fp8-weights keep,dequantize --json "$OUT/engine_fp8_b$b.json" 2>&1 | grep -v '^{' | tail -6
done
date

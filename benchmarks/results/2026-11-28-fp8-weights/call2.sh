#!/bin/bash
# Session 50, call 2: FP8-weight GPU tests (logged), the dense GEMMs with the quantization fused and DeepGEMM from 64 rows, engine A/B at batch 32 and 1.
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
echo "== tests"; date
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemm.py tests/test_fp8_weights.py > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -25
echo "== checkpoint"; date
[ -d /tmp/v32 ] || timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
echo "== engine batch 32"; date
timeout 150 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 --rounds 3 \
  --backends graph --fp8-weights keep,dequantize --json "$OUT/engine_fp8_b32.json" 2>&1 | grep -v '^{' | tail -8
echo "== engine batch 1"; date
timeout 100 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 1 --prompt-len 2112 --steps 16 --rounds 3 \
  --backends graph --fp8-weights keep,dequantize --json "$OUT/engine_fp8_b1.json" 2>&1 | grep -v '^{' | tail -8
echo "== gemm"; date
timeout 150 python3 benchmarks/bench_fp8_gemm.py --only dense --rows 1,4,32,64,256 --json $OUT/fp8_gemm_dense.json > $OUT/gemm_log.txt 2>&1
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/fp8_gemm_dense.json"))
for r in d["rows"]:
    print(r["layer"], r["m"], r["roofline_us"], "ours", r["ours_us"], "auto", r["auto_us"], "gemm", r["ours_gemm_us"], "dg", r.get("deepgemm_us"), "bf16", r["bf16_us"])
PY
date

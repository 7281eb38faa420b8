#!/bin/bash
# Session 58, call 3: DeepGEMM's row halves: the calibration over the engine's shapes, and GPU tests
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
cd benchmarks
timeout 240 python3 bench_fp8_gemm.py --only halves --max-rows 2048 --json $OUT/call3_halves.json > $OUT/call3_halves.txt 2>&1
grep -v '^{"date' $OUT/call3_halves.txt | tail -40
cd ..
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/kernels/test_deepgemm_rows.py tests/kernels/test_fp8_gemm.py \
    tests/test_fp8_weights.py tests/test_warmup.py 2>&1 | grep -v "^$" | tail -15 | tee $OUT/call3_gpu_tests.txt

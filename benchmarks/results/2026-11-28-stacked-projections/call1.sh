#!/bin/bash
# Session 56, call 1: GPU tests (the stacked projections, and session 55's unverified host-path
# judging), then the stacked projections' GEMMs against a GEMM a layer at DeepSeek-V3.2's shapes
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_fp8_gemm.py tests/test_fp8_weights.py \
    tests/test_cuda_graphs.py tests/test_spec_chain.py tests/test_spec.py tests/test_spec_tree.py tests/test_warmup.py \
    2>&1 | tail -15 | tee $OUT/call1_gpu_tests.txt
cd benchmarks && timeout 150 python3 bench_fp8_gemm.py --only stacked --rows 1,4,32,128,1024 \
    --json $OUT/call1_stacked.json 2>&1 | grep -v "^{" | tail -5

#!/bin/bash
# Session 57, call 3: routed experts, module level: this tree (DeepGEMM from 8192 pairs, fused activation and sum)
# against a04bf2e (ours, torch glue); GPU tests of the new kernels
set -u
source .device/setup.sh && mkdir -p /tmp/dsa /tmp/dsa_base && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
ln -sfn "$PWD/.ab/s57/base/kernels" /tmp/dsa_base/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
T=1,32,128,512,1024,2048,8192
(cd benchmarks && timeout 200 python3 bench_fp8_gemm.py --only experts --tokens $T --json $OUT/call3_experts_head.json 2>&1 | grep -v '^{"date' | tail -8)
(cd .ab/s57/base/benchmarks && PYTHONPATH=/tmp/dsa_base:$PWD/.. timeout 150 python3 bench_fp8_gemm.py --only experts --tokens $T --json $OUT/call3_experts_base.json 2>&1 | grep -v '^{"date' | tail -8)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_fp8_gemm.py tests/test_moe.py \
    tests/kernels/test_moe_runs.py 2>&1 | tail -6 | tee $OUT/call3_gpu_tests.txt

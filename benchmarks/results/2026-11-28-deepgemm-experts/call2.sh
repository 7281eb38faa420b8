#!/bin/bash
# Session 57, call 2: routed experts on DeepGEMM's grouped GEMM (psum layout) against ours, module level; GPU tests
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
cd benchmarks
timeout 300 python3 -c "
import sys
import dsa_kernels.dispatch as d
d.DEEPGEMM_GROUPED_PAIRS = 512  # DeepGEMM at every size timed, to place the threshold
import bench_fp8_gemm as b
sys.argv = ['bench_fp8_gemm.py', '--only', 'experts', '--tokens', '64,256,512,1024,2048,4096,8192', '--json', '$OUT/call2_experts.json']
b.main()
" 2>&1 | grep -v '^{"date' | tail -12
cd ..
timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_fp8_gemm.py tests/test_moe.py \
    tests/test_fp8_weights.py 2>&1 | tail -15 | tee $OUT/call2_gpu_tests.txt

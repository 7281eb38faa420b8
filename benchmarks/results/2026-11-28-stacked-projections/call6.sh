#!/bin/bash
# Session 56, call 6: the absorbed query written by the RoPE kernel behind the latent (no cat)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 40 python3 .ab/s56/absorbed_q.py $OUT/call6_absorbed_q.json
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_norm_rope.py tests/test_cuda_graphs.py \
    2>&1 | tail -3 | tee $OUT/call6_gpu_tests.txt

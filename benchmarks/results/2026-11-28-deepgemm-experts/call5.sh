#!/bin/bash
# Session 57, call 5: the engine's GPU tests after the MoE changes (DeepGEMM grouped, fused activation and sum)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_graphs.py tests/test_warmup.py tests/test_overlap.py \
    tests/test_spec_chain.py tests/test_spec_tree.py tests/test_models.py tests/test_batch_invariance.py tests/test_fp8_weights.py \
    tests/test_batch.py tests/test_token_counts.py 2>&1 | tail -8 | tee $OUT/call5_gpu_tests.txt

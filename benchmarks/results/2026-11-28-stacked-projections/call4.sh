#!/bin/bash
# Session 56, call 4: batch fields on 16-byte boundaries: the warm-up test, the GPU tree test,
# graphs and overlap (the batch build changed), after the change
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short tests/test_warmup.py \
    tests/test_spec_tree.py tests/test_cuda_graphs.py tests/test_overlap.py tests/test_batch.py tests/test_token_counts.py \
    > $OUT/call4_gpu_tests.txt 2>&1
tail -25 $OUT/call4_gpu_tests.txt | cut -c1-300

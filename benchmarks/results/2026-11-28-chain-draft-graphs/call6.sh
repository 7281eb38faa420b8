#!/bin/bash
# Session 51, call 6: GPU tests after the padding-row fix and the acceptance change
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_spec_chain.py tests/test_cuda_graphs.py tests/test_spec.py tests/test_spec_tree.py > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -8

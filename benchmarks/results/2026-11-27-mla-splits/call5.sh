#!/usr/bin/env bash
# Session 46, call 5: sparse MLA with num_splits unspecialized: its compiles over batches 1-48, the new test, its GPU tests
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
timeout 200 python3 .ab/s46/variants.py mla > $OUT/mla.txt 2>&1; echo "mla rc $? $(( $(date +%s) - start )) s"; grep -v "^[0-9]" $OUT/mla.txt | cut -c1-300 | tail -8
timeout $(( 560 - $(date +%s) + start )) python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_specialization.py \
  tests/kernels/test_sparse_mla.py 2>&1 | grep -v "^  " | tail -15
echo "done $(( $(date +%s) - start )) s"

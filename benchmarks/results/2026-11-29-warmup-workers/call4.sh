#!/bin/bash
# Session 60, call 4: the warm-up GPU tests with workers claiming blocks
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
t0=$(date +%s)
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_warmup.py --durations=4 2>&1 | tail -9 | tee $OUT/gpu_tests.txt
echo "done $(( $(date +%s) - t0 )) s"

#!/bin/bash
# Session 59, call 5: speculative and batching serving tests against the GPU server (replies that cover several verify steps)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels 2>&1 | tail -1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_speculative.py tests/serving/test_server_batching.py 2>&1 | tail -6 | tee $OUT/call5_gpu_tests.txt

#!/bin/bash
# Session 60, call 2: warm-up workers: GPU tests, then cold warm-up time at small limits, workers 8 vs the engine alone
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader; nproc
t0=$(date +%s)
cd benchmarks
timeout 280 python3 bench_warmup.py --limits 8 256 16384 --workers 8 0 --check --json $OUT/warmup_small.json 2>&1 | tail -5
echo "bench $(( $(date +%s) - t0 )) s"
cd ..
timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_warmup.py -x 2>&1 | tail -5 | tee $OUT/gpu_tests.txt
echo "done $(( $(date +%s) - t0 )) s"

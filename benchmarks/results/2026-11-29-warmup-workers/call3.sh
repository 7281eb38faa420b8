#!/bin/bash
# Session 60, call 3: warm-up workers claiming blocks: small limits (8 workers, then the engine alone), GPU tests, default limits
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
t0=$(date +%s)
cd benchmarks
timeout 100 python3 bench_warmup.py --limits 8 256 16384 --workers 8 --check --json $OUT/warmup_small_w8.json 2>&1 | grep -v "^{\"bench" | tail -3
echo "small w8 $(( $(date +%s) - t0 )) s"
cd ..
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_warmup.py -k "auto-4" 2>&1 | tail -2 | tee $OUT/gpu_tests.txt
echo "tests $(( $(date +%s) - t0 )) s"
cd benchmarks
timeout 200 python3 bench_warmup.py --limits 64 2048 163840 --workers 8 --timeout-s 190 --json $OUT/warmup_default_w8.json 2>&1 | grep -v "^{\"bench" | tail -3
echo "default w8 $(( $(date +%s) - t0 )) s"
timeout 175 python3 bench_warmup.py --limits 8 256 16384 --workers 0 --json $OUT/warmup_small_w0.json 2>&1 | grep -v "^{\"bench" | tail -3
echo "done $(( $(date +%s) - t0 )) s"

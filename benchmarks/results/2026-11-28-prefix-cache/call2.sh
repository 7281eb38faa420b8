#!/bin/bash
# Session 54, call 2: prefix caching benchmark with both modes warmed up; GPU tests with the cache on
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_invariance.py tests/test_overlap.py \
    tests/test_cuda_graphs.py tests/test_spec_chain.py 2>&1 | tail -6 | tee $OUT/call2_tests.txt
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
cd benchmarks
timeout 150 python3 bench_prefix_cache.py --model /tmp/v32 --prefix-len 8192 --batch 16 --rounds 3 \
    --json $OUT/call2_prefix_8k.json 2>&1 | grep -v Warning | grep round
timeout 170 python3 bench_prefix_cache.py --model /tmp/v32 --prefix-len 32768 --batch 8 --rounds 3 \
    --json $OUT/call2_prefix_32k.json 2>&1 | grep -v Warning | grep round

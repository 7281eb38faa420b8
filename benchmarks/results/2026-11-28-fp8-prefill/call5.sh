#!/bin/bash
# Session 58, call 5: FP8-pool prefill gathered for FlashMLA's prefill kernel: module probe, GPU tests, engine prefill A/B
set -u
ROOT=$PWD
source .device/setup.sh && mkdir -p /tmp/dsa /tmp/dsa_base && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
ln -sfn "$ROOT/.ab/s58/base/kernels" /tmp/dsa_base/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 150 python3 .ab/s58/fp8_prefill_probe.py $OUT/call5_probe.json 2>&1 | grep -v Warn | tail -14
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py 2>&1 | tail -4 | tee $OUT/call5_gpu_tests.txt
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 > /dev/null 2>&1
cd benchmarks && timeout 80 python3 bench_prefill.py --model /tmp/v32 --prompt-len 8192 --batch 2 --rounds 3 --json $OUT/call5_prefill_head.json 2>&1 | tail -1
cd $ROOT/.ab/s58/base/benchmarks && PYTHONPATH=/tmp/dsa_base:$ROOT/.ab/s58/base timeout 80 python3 bench_prefill.py --model /tmp/v32 --prompt-len 8192 --batch 2 --rounds 3 --json $OUT/call5_prefill_base.json 2>&1 | tail -1

#!/bin/bash
# Session 58, call 6: the FP8-pool prefill gather at 64 heads (GLM-5) and below 64 tokens: probe; GLM-5 slice prefill A/B; GPU attention tests
set -u
ROOT=$PWD
source .device/setup.sh && mkdir -p /tmp/dsa /tmp/dsa_base && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
ln -sfn "$ROOT/.ab/s58/base/kernels" /tmp/dsa_base/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
HEADS=64 CASES=small timeout 100 python3 .ab/s58/fp8_prefill_probe.py $OUT/call6_probe64.json 2>&1 | grep -v Warn | tail -14
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention.py 2>&1 | tail -2 | tee $OUT/call6_gpu_tests.txt
python3 -m dsa_backend.tools.make_checkpoint --arch glm_moe_dsa --preset glm5-slice --out /tmp/glm --fp8 > /dev/null 2>&1
cd benchmarks && timeout 70 python3 bench_prefill.py --model /tmp/glm --prompt-len 8192 --batch 2 --rounds 3 --json $OUT/call6_glm_head.json 2>&1 | tail -1
cd $ROOT/.ab/s58/base/benchmarks && PYTHONPATH=/tmp/dsa_base:$ROOT/.ab/s58/base timeout 70 python3 bench_prefill.py --model /tmp/glm --prompt-len 8192 --batch 2 --rounds 3 --json $OUT/call6_glm_base.json 2>&1 | tail -1

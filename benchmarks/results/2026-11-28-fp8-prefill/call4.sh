#!/bin/bash
# Session 58, call 4: an engine prefill step's GPU time by kernel (v32 slice, FP8), after the FP8 warm-up
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 > /dev/null 2>&1
timeout 420 python3 .ab/s58/prefill_profile.py /tmp/v32 $OUT/call4_prefill_profile.json 2>&1 | grep -v Warning | tail -60

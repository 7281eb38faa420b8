#!/bin/bash
# Session 55, call 3: where a chain step's time goes now: GPU busy time against the step, plain
# decode for scale, and the host's profile
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
timeout 250 python3 .ab/s55/gpu_busy.py --model /tmp/v32 --spec-steps 2 2>&1 | grep -v Warn > $OUT/call3_spec2.txt
timeout 150 python3 .ab/s55/gpu_busy.py --model /tmp/v32 --spec-steps 0 2>&1 | grep -v Warn > $OUT/call3_plain.txt
head -30 $OUT/call3_spec2.txt; head -3 $OUT/call3_plain.txt

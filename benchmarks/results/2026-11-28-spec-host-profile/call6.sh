#!/bin/bash
# Session 54, call 6: host profile of MTP chain speculative steps (batch 32, v32 slice)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
timeout 250 python3 benchmarks/results/2026-11-28-spec-host-profile/spec_profile.py --model /tmp/v32 2>&1 | grep -v Warning > $OUT/call6_profile.txt; tail -c 11000 $OUT/call6_profile.txt

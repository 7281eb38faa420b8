#!/usr/bin/env bash
# Session 44, call 4: the L2 set-aside alone (no window) against the window and nothing
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
MODES=0,1,limit KERNELS=ours timeout 250 python3 benchmarks/results/2026-11-27-l2-setaside/l2win_nextn.py > $OUT/nextn.log 2>&1; echo "nextn rc $?"
SHAPES=32x32768,128x32768,32x131072 timeout 250 python3 benchmarks/results/2026-11-27-l2-setaside/l2win_ab.py > $OUT/pair.log 2>&1; echo "pair rc $?"
tail -3 $OUT/pair.log

#!/usr/bin/env bash
# Session 45, call 6: logits row strides that are not a multiple of 16 (the engine's), against padded rows
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 300 python3 .ab/s45/align_ab.py $OUT/align_ab.json 2>&1 | tail -20

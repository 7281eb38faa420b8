#!/usr/bin/env bash
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 280 python3 .ab/s46/variants.py mla > $OUT/mla.txt 2>&1; echo "mla rc $?"; grep -v "^[0-9]" $OUT/mla.txt | tail -30
timeout 250 python3 .ab/s46/variants.py index > $OUT/index.txt 2>&1; echo "index rc $?"; grep -v "^[0-9]" $OUT/index.txt | tail -30

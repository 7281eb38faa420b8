#!/usr/bin/env bash
# Session 45, call 5: the engine's slow kernel decode steps, and what compiles inside them
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
[ -d /tmp/v32 ] || python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
export TRITON_CACHE_DIR=/tmp/tcache_cold_$$
timeout 400 python3 .ab/s45/engine_compiles.py /tmp/v32 > $OUT/compiles.txt 2>&1; echo "rc $?"
grep -v '^step' $OUT/compiles.txt | head -150; grep '^step' $OUT/compiles.txt | awk '{print $2, $3}' | tr '\n' ' ' | head -c 3000

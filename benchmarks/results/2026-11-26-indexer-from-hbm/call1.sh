#!/usr/bin/env bash
# bench_kernels' indexer section on the session's final kernels, with the new rows that read the
# keys of small grids from HBM (rotating block tables), for ours and DeepGEMM.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/b" && OUT="$OUT/b" timeout 420 python3 benchmarks/bench_kernels.py --only indexer --budget 330 2>&1 \
  | grep -v '"check"' | grep -i "hbm\|error\|Traceback" | cut -c1-400 | tail -40

#!/usr/bin/env bash
# The logits' -inf fill the engine now skips: clean_ab.py, and the engine's GPU tests on the change.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 300 python3 benchmarks/results/2026-11-26-clean-logits/clean_ab.py > "$OUT/clean_ab.log" 2>&1
echo "ab rc $?"; cut -c1-300 "$OUT/clean_ab.log" | tail -60
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/kernels/test_topk.py \
  2>&1 | grep -v "^  " | tail -8 | tee "$OUT/gpu-tests.txt"

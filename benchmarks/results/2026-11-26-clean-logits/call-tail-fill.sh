#!/usr/bin/env bash
# DeepGEMM's paged logits cleaned by one tail fill: the dispatch GPU test, and clean_ab.py (clean against not).
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_indexer_logits.py tests/kernels/test_dispatch.py \
  2>&1 | grep -v "^  " | tail -8 | tee "$OUT/gpu-tests.txt"
timeout 300 python3 benchmarks/results/2026-11-26-clean-logits/clean_ab.py > "$OUT/clean_ab.log" 2>&1
echo "ab rc $?"; grep '"decode"' "$OUT/clean_ab.log" | grep '"auto"' | cut -c1-200

#!/usr/bin/env bash
# Our ragged indexer logits computing only the tiles a query block sees: A/B against the committed kernel, and the indexer GPU tests.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
# .ab/indexer_base.py: git show ed7aaca:kernels/indexer_logits.py
timeout 300 python3 benchmarks/results/2026-11-26-clean-logits/ragged_ab.py .ab/indexer_base.py > "$OUT/ragged_ab.log" 2>&1
echo "ab rc $?"; cut -c1-300 "$OUT/ragged_ab.log" | tail -20
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_indexer_logits.py tests/test_attention.py \
  2>&1 | grep -v "^  " | tail -8 | tee "$OUT/gpu-tests.txt"

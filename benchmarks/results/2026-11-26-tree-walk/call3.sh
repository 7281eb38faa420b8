#!/usr/bin/env bash
# Tree top-k with the ancestors' logits moved in place: the A/B against the gathered layout, then
# the attention and batch-invariance GPU tests.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 240 python3 benchmarks/results/2026-11-26-tree-walk/tree_topk_ab.py 2>&1 | grep -v Warning | cut -c1-400
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py 2>&1 | tail -2 | tee "$OUT/gpu-tests.txt"
timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -2 | tee -a "$OUT/gpu-tests.txt"

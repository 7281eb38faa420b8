#!/usr/bin/env bash
# Tree verify's indexer with one page walk a request: the attention and batch-invariance GPU tests
# (the latter runs EAGLE tree drafting through the FP8 kernels against plain greedy), then the A/B.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py 2>&1 | tail -3 | tee "$OUT/gpu-tests.txt"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -3 | tee -a "$OUT/gpu-tests.txt"
timeout 200 python3 benchmarks/results/2026-11-26-tree-walk/tree_walk_ab.py 2>&1 | grep -v Warning | cut -c1-400

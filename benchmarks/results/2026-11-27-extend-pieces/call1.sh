#!/usr/bin/env bash
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; exit 0
fi
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
timeout 240 python3 benchmarks/results/2026-11-27-extend-pieces/extend_pieces.py 2>&1 | tail -20
echo "pieces rc $? $(( $(date +%s) - start )) s"
timeout 280 python3 -m pytest -q -m gpu tests/test_attention.py tests/kernels/test_indexer_logits.py tests/kernels/test_cache_store.py -x 2>&1 | tail -5
echo "tests rc $? $(( $(date +%s) - start )) s"

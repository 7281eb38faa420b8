#!/usr/bin/env bash
# Host time a call before (.ab/kernels_before: the kernels at 3466b97) and after the per-device
# constants and TMA layouts were cached, alternating, twice each; then the kernel and attention GPU tests.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
for i in 1 2; do
  for tag in before after; do
    if [ $tag = before ]; then ln -sfn "$PWD/.ab/kernels_before/kernels" /tmp/dsa/dsa_kernels; else ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels; fi
    echo "== $tag $i"; HOST_TAG=$tag$i timeout 60 python3 benchmarks/results/2026-11-26-tree-walk/host_profile.py 2>&1 | grep -v Warn
  done
done
ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/kernels/test_indexer_logits.py \
  tests/kernels/test_topk.py tests/kernels/test_dispatch.py 2>&1 | tail -3 | tee "$OUT/gpu-tests.txt"

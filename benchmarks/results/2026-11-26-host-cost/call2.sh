#!/usr/bin/env bash
# Host time a call before (.ab/kernels_before: the kernels at e73e7cc) and after the launch
# wrappers stopped calling triton.cdiv / next_power_of_2 from Python, alternating, twice each;
# then the kernel and attention GPU tests on the new kernels.
source .device/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
for i in 1 2; do
  for tag in before after; do
    if [ $tag = before ]; then ln -sfn "$PWD/.ab/kernels_before/kernels" /tmp/dsa/dsa_kernels; else ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels; fi
    echo "== $tag $i"; HOST_TAG=$tag$i timeout 90 python3 benchmarks/results/2026-11-26-host-cost/host_ab.py 2>&1 | grep -v Warn
  done
done
ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/kernels 2>&1 \
  | grep -v "^  " | tail -8 | tee "$OUT/gpu-tests.txt"

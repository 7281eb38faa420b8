#!/usr/bin/env bash
# Uneven token counts on our kernel (backend "ours"): bench_spec (chain and tree drafting against
# plain greedy decoding, device_checks' spec stage), then the attention, dispatch and
# batch-invariance GPU tests.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 380 python3 benchmarks/bench_spec.py --out "$OUT/spec" --train-steps 300 2>&1 | tail -16
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/kernels/test_dispatch.py 2>&1 \
  | tail -3 | tee "$OUT/gpu-tests.txt"
timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -3 | tee -a "$OUT/gpu-tests.txt"

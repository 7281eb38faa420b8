# Device call 7 (2026-11-26): whole-row merges and the one-tile split rule against the call-3
# kernels and the session's start, then the sparse MLA, dispatch and attention GPU tests.
source .device/setup.sh
timeout 150 python3 benchmarks/results/2026-11-26-dispatch/merge_ab.py 2>&1 | tail -20
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_mla.py tests/kernels/test_dispatch.py \
  tests/test_attention.py 2>&1 | grep -v "^  " | tail -8 | tee "$OUT/gpu-tests.txt"

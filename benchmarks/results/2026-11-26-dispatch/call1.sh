# Device call 1 (2026-11-26): ours against the libraries where "auto" chooses, then the GPU tests
# of the dispatch, the kernels it chooses between, the engine's attention and batch invariance.
set -x
source .device/setup.sh
python3 benchmarks/results/2026-11-26-dispatch/auto_vs_libraries.py 2>&1 | tail -80
python3 -m pytest -q -m gpu tests/kernels/test_dispatch.py tests/test_attention.py tests/test_batch_invariance.py \
  tests/kernels/test_sparse_mla.py tests/kernels/test_indexer_logits.py -x 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"

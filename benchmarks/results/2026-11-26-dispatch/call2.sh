# Device call 2 (2026-11-26): sparse MLA's split at 1-16 rows, then the GPU tests of the dispatch
# (revised FlashMLA rule), the kernels it chooses between, the engine's attention and batch invariance.
source .device/setup.sh
python3 benchmarks/results/2026-11-26-dispatch/small_batch_splits.py 2>&1 | tail -40
python3 -m pytest -q -m gpu tests/kernels/test_dispatch.py tests/test_attention.py tests/test_batch_invariance.py \
  tests/kernels/test_sparse_mla.py tests/kernels/test_indexer_logits.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"

# Device call 4 (2026-11-26): the GPU tests call 3's 330 s cut short (it ran 181, all passing, in
# tests/test_attention.py and tests/kernels up to the sparse MLA module), on the final rules.
source .device/setup.sh
timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_dispatch.py tests/kernels/test_grid_barrier.py \
  tests/kernels/test_sparse_mla.py tests/kernels/test_topk.py tests/kernels/test_topk_cooperative.py 2>&1 | grep -v "^  " | tail -20 | tee "$OUT/gpu-tests.txt"

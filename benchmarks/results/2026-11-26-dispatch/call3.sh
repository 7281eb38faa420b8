# Device call 3 (2026-11-26): the short-program split rule against the commit before, then the GPU
# tests as device_checks.sh runs them (batch invariance in a process of its own: it patches aten
# for its whole process, which is what failed 11 sparse MLA tests in call 2).
source .device/setup.sh
timeout 100 python3 benchmarks/results/2026-11-26-dispatch/short_programs_ab.py 2>&1 | tail -20
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -4 | tee "$OUT/gpu-tests-batch-invariance.txt"
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/kernels 2>&1 | grep -v "^  " | tail -20 | tee "$OUT/gpu-tests.txt"

#!/usr/bin/env bash
# On an H200 only (an H100 ends the call at once): the full bench_kernels run on the current
# kernels, which the H200 column of docs/PERFORMANCE.md lacks since the twenty-fourth session,
# then the batch-invariance GPU tests with whatever time is left.
source .device/setup.sh || exit 1
nvidia-smi --query-gpu=name,uuid,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
[[ $(nvidia-smi --query-gpu=name --format=csv,noheader) == *H200* ]] || exit 0
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/b" && OUT="$OUT/b" timeout 420 python3 benchmarks/bench_kernels.py --budget 330 > "$OUT/bench.log" 2>&1
echo "bench rc $?"
grep -v '^{' "$OUT/bench.log" | cut -c1-200 | tail -30
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -3

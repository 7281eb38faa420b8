#!/usr/bin/env bash
# The final rule: its A/B against the committed one, the indexer GPU tests and the batch-invariance
# tests on it, and bench_kernels' indexer section (the official rows).
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/results/2026-11-26-small-grid-next-n/chunks_ab.py 2>&1 | grep -v Warning \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l[:200], end=""); continue
    print(r["batch"], r["ctx"], r["next_n"], r["before"], r["after"], r["ms"], all(r["same"].values()), r["speedup"])'
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_indexer_logits.py 2>&1 | tail -2
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -2
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_batch_invariant.py 2>&1 | tail -2
mkdir -p "$OUT/b" && OUT="$OUT/b" timeout 200 python3 benchmarks/bench_kernels.py --only indexer --budget 300 2>&1 \
  | grep -v '"check"' | tail -3

#!/usr/bin/env bash
# The final rule (programs of one or two tokens at next_n 3 and above 4): its indexer and attention
# GPU tests, the batch-invariance tests, and the A/B against the Triton kernel at next_n 3 / 5-8.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_indexer_logits.py tests/test_attention.py \
  2>&1 | tail -3
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -2
NEXT_NS='1 3 4 5 6 7 8' timeout 220 python3 benchmarks/results/2026-11-26-one-token-programs/next_n_ab.py 2>&1 | grep -v Warning \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l[:300], end=""); continue
    print(r["batch"], r["ctx"], r["next_n"], r["tokens_a_program"], r["us"], all(r["same"].values()), r["cost"], r["speedup"])'

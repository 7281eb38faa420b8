#!/usr/bin/env bash
# One program a query token at next_n 2-4 on small grids: the A/B, then the indexer GPU tests.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 330 python3 benchmarks/results/2026-11-26-one-token-programs/one_token_ab.py 2>&1 | grep -v Warning \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l[:300], end=""); continue
    print(r["batch"], r["ctx"], r["next_n"], r["us"], all(r["same"].values()), r["cost_now"], r["cost_one_token_best"], r["speedup_best"])'
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_indexer_logits.py 2>&1 | tail -2

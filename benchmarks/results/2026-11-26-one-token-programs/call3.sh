#!/usr/bin/env bash
# Programs of one, two or four tokens at next_n 3 / 5 / 6 / 8 (the kernel with TOKENS_A_PROGRAM).
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 420 python3 benchmarks/results/2026-11-26-one-token-programs/groups_ab.py 2>&1 | grep -v Warning \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l[:300], end=""); continue
    print(r["batch"], r["ctx"], r["next_n"], r["us"], all(r["same"].values()), r["cost"], r["chunks"])'

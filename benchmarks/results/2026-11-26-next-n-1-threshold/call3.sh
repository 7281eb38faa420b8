#!/usr/bin/env bash
# The small-grid rules (next_n 2 and 4 chunks; one or two tokens a program) with keys from HBM.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/results/2026-11-26-next-n-1-threshold/small_grids_hbm.py 2>&1 | grep -v Warning \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l[:300], end=""); continue
    print(r["batch"], r["ctx"], r["next_n"], r["picked"], r["us"], all(r["same"].values()), r["best"], r["rule_over_best"])'

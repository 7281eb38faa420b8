#!/usr/bin/env bash
# next_n 4's second weights loaded per unit (W1_LAZY) against the committed kernel, large grids.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import importlib.util, torch
spec = importlib.util.spec_from_file_location("dsa_kernels.variant", ".ab/indexer_w1.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
PY
timeout 400 python3 benchmarks/results/2026-11-26-lazy-weights/lazy_w1_ab.py 2>&1 | grep -v Warning \
  | python3 -c 'import json,sys
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l[:300], end=""); continue
    print(r["batch"], r["ctx"], r["cfg"]["KEYS_PER_PROG"], r["cfg"]["OVERLAP"], r["us"], r["next_n_1_us"], all(r["same"].values()), r["cost"], r["speedup"])'

#!/usr/bin/env bash
# top-k output slots looked up early: GPU tests, then A/B against the committed kernel
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_topk.py tests/kernels/test_topk_cooperative.py -x 2>&1 | tail -4 | tee $OUT/gpu-tests.txt
echo "tests $(( $(date +%s) - start )) s"
timeout 260 python3 benchmarks/topk_ab.py quick rounds=3 base=.ab/base.py > $OUT/ab.log 2>&1; echo "ab rc $?"

echo "ab $(( $(date +%s) - start )) s"
OUT2=$OUT/flush; mkdir -p $OUT2
OUT=$OUT2 timeout 120 python3 benchmarks/topk_ab.py nochecks flush rounds=3 shapes=32x32768,16x32768,128x32768,32x131072 base=.ab/base.py > $OUT2/ab.log 2>&1; echo "flush rc $?"
echo "all $(( $(date +%s) - start )) s"
python3 - <<'PY'
import json, os, collections
for f in (os.environ["OUT"] + "/topk_ab.json", os.environ["OUT"] + "/flush/topk_ab.json"):
    if not os.path.exists(f): print("missing", f); continue
    r = json.load(open(f))
    print(f, r["gpu"], [n for n in r["notes"]])
    best = collections.defaultdict(lambda: 1e9)
    for row in r["rows"]:
        k = (tuple(row["shape"]), row["kernel"])
        best[k] = min(best[k], row["behind_us"])
    shapes = sorted({k[0] for k in best})
    for s in shapes:
        print(s, {k[1]: round(v, 2) for k, v in best.items() if k[0] == s})
PY
if grep -q H200 $OUT/gpu.txt && [ $(( $(date +%s) - start )) -lt 380 ]; then
  mkdir -p $OUT/decode; OUT=$OUT/decode timeout $(( 560 - $(date +%s) + start )) python3 benchmarks/bench_kernels.py --only decode --budget 150 > $OUT/decode/log.txt 2>&1
  tail -20 $OUT/decode/results.md
fi

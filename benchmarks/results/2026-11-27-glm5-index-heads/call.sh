#!/usr/bin/env bash
# GLM-5's 32 indexer heads: the new GPU tests, then the official indexer section at 32 heads
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
if grep -q H200 $OUT/gpu.txt; then
  mkdir -p $OUT/decode; OUT=$OUT/decode timeout 200 python3 benchmarks/bench_kernels.py --only ceilings,decode --budget 170 > $OUT/decode/log.txt 2>&1
  tail -30 $OUT/decode/results.md
fi
timeout 150 python3 -m pytest -q -m gpu -k fewer_heads tests/kernels/test_indexer_logits.py 2>&1 | tail -4 | tee $OUT/gpu-tests.txt
echo "tests $(( $(date +%s) - start )) s"
left=$(( 570 - $(date +%s) + start ))
mkdir -p $OUT/h32
OUT=$OUT/h32 timeout $left python3 benchmarks/bench_kernels.py --only ceilings,indexer --index-heads 32 --budget $(( left - 60 )) > $OUT/h32/log.txt 2>&1
echo "bench rc $? after $(( $(date +%s) - start )) s"
grep -v "^|" $OUT/h32/results.md | tail -5
python3 - <<'PY'
import json, os
r = json.load(open(os.environ["OUT"] + "/h32/results.json"))
print(r.get("gpu"), r.get("index_heads"), r.get("errors"))
rows = {}
for x in r["rows"]:
    if x.get("section") != "indexer":
        continue
    key = (x.get("batch"), x.get("ctx"), x.get("next_n"))
    rows.setdefault(key, {})[x["name"]] = x
for key, d in sorted(rows.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0] or 0, kv[0][2] or 0)):
    ours = d.get("default paged, CUDA graph", {}).get("ms")
    dg = d.get("deepgemm paged", {}).get("graph_ms")
    hbm = d.get("default paged, CUDA graph, keys from HBM", {})
    print(key, "ours", ours, "dg", dg, "ours/dg speed", round(dg / ours, 3) if ours and dg else None,
          "copy", d.get("default paged, CUDA graph", {}).get("copy_frac"), "hbm", hbm.get("ms"), hbm.get("deepgemm_graph_ms"))
PY

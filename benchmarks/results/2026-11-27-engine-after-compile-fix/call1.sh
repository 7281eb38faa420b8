#!/usr/bin/env bash
# Session 46, call 1: on an H200 the unmeasured rows (call5.sh); on an H100 the engine benchmark after the compile fix
# and the GPU tests of the kernels the last commit touched.
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then exec bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; fi
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
git log --oneline -1 2>/dev/null | tee $OUT/commit.txt
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
echo "ckpt $(( $(date +%s) - start )) s"
timeout 300 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 \
  --json "$OUT/bench_engine.json" > $OUT/bench_engine.txt 2>&1
echo "engine rc $? $(( $(date +%s) - start )) s"; tail -6 $OUT/bench_engine.txt
left=$(( 570 - $(date +%s) + start ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_specialization.py tests/kernels/test_topk.py \
  tests/kernels/test_indexer_logits.py 2>&1 | grep -v "^  " | tail -15
echo "done $(( $(date +%s) - start )) s"

#!/bin/bash
# Session 52, call 1: on an H200, issue 4's unmeasured rows (call5.sh of 2026-11-27) and nothing else.
# Otherwise: GPU tests of overlap scheduling and of what its copies touch; engine A/B, overlap on (graph) / off (graph-sync)
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; exit 0; fi
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
(timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1; echo "checkpoint rc $?" > $OUT/ckpt.txt) &
echo "== tests $(date +%T)"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_overlap.py tests/test_cuda_graphs.py tests/test_spec_chain.py \
  "tests/test_models.py::test_prefill_decode_and_verify_forwards_read_nothing_back_from_the_gpu" > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -8
wait; cat $OUT/ckpt.txt
for b in 32 4 1; do
  left=$(( 585 - $(date +%s) + start )); [ $left -lt 60 ] && break
  echo "== engine b$b ($left s) $(date +%T)"
  timeout $(( left < 200 ? left : 200 )) python3 benchmarks/bench_engine.py --model /tmp/v32 --batch $b --prompt-len 2112 --steps 32 --rounds 3 \
    --backends graph,graph-sync --json "$OUT/engine_b$b.json" 2>&1 | grep -v '^{' | tail -7
done
date +%T

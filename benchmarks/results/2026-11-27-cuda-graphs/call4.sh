#!/bin/bash
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
R=benchmarks/results/2026-11-27-cuda-graphs
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
echo "== tests"; date
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -15
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
echo "== step parts"; date
timeout 120 python3 $R/step_parts.py --model /tmp/v32 --batch 32 --json $OUT/step_parts_b32.json 2>&1 | tail -2
timeout 90 python3 $R/step_parts.py --model /tmp/v32 --batch 4 --json $OUT/step_parts_b4.json 2>&1 | tail -2
echo "== engine"; date
timeout 200 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 32 --rounds 3 \
  --backends graph,kernel --json "$OUT/engine_b32.json" 2>&1 | grep -v '^{' | tail -8
timeout 100 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 1 --prompt-len 2112 --steps 32 --rounds 3 \
  --backends graph,kernel --json "$OUT/engine_b1.json" 2>&1 | grep -v '^{' | tail -8
echo "== capture all"; date
timeout 150 python3 $R/capture_all.py --model /tmp/v32 --json $OUT/capture_all.json 2>&1 | tail -2
date

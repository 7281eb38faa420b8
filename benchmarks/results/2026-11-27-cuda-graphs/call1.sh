#!/bin/bash
# Session 49, call 1: CUDA-graph decode tests, then the engine A/B (graphs vs eager) in one process.
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
echo "== tests"; date
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_cuda_graphs.py 2>&1 | tail -25
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_models.py -k read_nothing_back 2>&1 | tail -3
echo "== checkpoint"; date
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
echo "== engine batch 32"; date
timeout 200 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 --rounds 3 \
  --backends graph,kernel --json "$OUT/engine_b32.json" 2>&1 | grep -v '^{' | tail -12
echo "== engine batch 4"; date
timeout 120 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 4 --prompt-len 2112 --steps 16 --rounds 3 \
  --backends graph,kernel --json "$OUT/engine_b4.json" 2>&1 | grep -v '^{' | tail -12
date

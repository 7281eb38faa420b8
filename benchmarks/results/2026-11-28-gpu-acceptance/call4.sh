#!/bin/bash
# Session 55, call 4: chain-2 speculative decode at batch 1 and 8 against 676438d (base), alternating
# processes; then the GLM-5 slice at batch 32 (head only)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
for batch in 1 8; do
for tree in base head head base; do
  if [ $tree = base ]; then root=$PWD/.ab/s55/base; else root=$PWD; fi
  PYTHONPATH=$root timeout 120 python3 $root/benchmarks/bench_engine.py --model /tmp/v32 --batch $batch --prompt-len 2112 \
      --steps 32 --rounds 2 --backends graph --speculative-num-steps 2 --json $OUT/call4_spec_b${batch}_$tree$RANDOM.json 2>&1 | grep "decode steps" | sed "s/^/b$batch $tree /"
done
done

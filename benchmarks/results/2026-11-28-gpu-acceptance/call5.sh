#!/bin/bash
# Session 55, call 5: every chain judged on the GPU (sampled ones too): GPU tests, then chain-2
# speculative decode of sampled requests (temperature 0.8, seeded) at batch 32 against 676438d
# (base; the same benchmark script) in alternating processes, and one greedy run of this tree
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_spec_chain.py tests/test_spec.py 2>&1 | tail -3 | tee $OUT/call5_gpu_tests.txt
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
for tree in base head head base greedy; do
  if [ $tree = base ]; then root=$PWD/.ab/s55/base; else root=$PWD; fi
  t=0.8; [ $tree = greedy ] && t=0
  PYTHONPATH=$root timeout 110 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 \
      --steps 16 --rounds 2 --backends graph --speculative-num-steps 2 --temperature $t --json $OUT/call5_spec_$tree$RANDOM.json 2>&1 | grep "decode steps" | sed "s/^/$tree /"
done

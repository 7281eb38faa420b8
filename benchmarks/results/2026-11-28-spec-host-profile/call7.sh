#!/bin/bash
# Session 54, call 7: chain drafts read back after the next verify is launched: GPU tests, then
# speculative decode (chain of 2, batch 32) against the tree before (base2) in alternating processes
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_spec_chain.py 2>&1 | tail -2 | tee $OUT/call7_gpu_tests.txt
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
for tree in base head; do
  if [ $tree = base ]; then root=$PWD/.ab/s54/base2; else root=$PWD; fi
  PYTHONPATH=$root timeout 120 python3 $root/benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 \
      --steps 16 --rounds 2 --backends graph --speculative-num-steps 2 --json $OUT/call7_spec_$tree$RANDOM.json 2>&1 | grep "decode steps" | sed "s/^/$tree /"
done

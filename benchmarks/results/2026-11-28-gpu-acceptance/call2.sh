#!/bin/bash
# Session 55, call 2: greedy chains accepted on the GPU, drafts launched before the host reads the
# verify: GPU tests, then chain-2 speculative decode at batch 32 against 676438d (base) in
# alternating processes
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_spec_chain.py tests/test_spec.py tests/test_cuda_graphs.py 2>&1 | tail -3 | tee $OUT/call2_gpu_tests.txt
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
for tree in base head head base; do
  if [ $tree = base ]; then root=$PWD/.ab/s55/base; else root=$PWD; fi
  PYTHONPATH=$root timeout 150 python3 $root/benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 \
      --steps 16 --rounds 2 --backends graph --speculative-num-steps 2 --json $OUT/call2_spec_$tree$RANDOM.json 2>&1 | grep "decode steps" | sed "s/^/$tree /"
done

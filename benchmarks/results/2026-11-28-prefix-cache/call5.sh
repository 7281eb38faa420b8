#!/bin/bash
# Session 54, call 5: the GPU tests in one process (batch-invariant mode now ends with its test),
# then decode with the prefix cache on by default (random prompts: no hits) against ddb7bb2
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_batch_invariant.py tests/test_batch_invariance.py \
    tests/test_cuda_graphs.py tests/test_overlap.py 2>&1 | tail -3 | tee $OUT/call5_gpu_tests.txt
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
for tree in base head; do
  if [ $tree = base ]; then root=$PWD/.ab/s54/base; else root=$PWD; fi
  PYTHONPATH=$root timeout 130 python3 $root/benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 \
      --steps 32 --rounds 2 --backends graph --json $OUT/call5_engine_$tree.json 2>&1 | grep "decode steps"
done

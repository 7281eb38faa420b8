#!/bin/bash
# Session 56, call 2: the two GPU tests that failed in call 1, in full, with warnings logged; then
# plain decode at batch 32 and 1 against 8926f04 (base: projections apart) in alternating processes
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
(python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1; echo ckpt $?) &
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -x --tb=long -o log_cli=true --log-cli-level=WARNING \
    "tests/test_warmup.py::test_after_the_warm_up_no_step_compiles_a_kernel[auto]" \
    tests/test_spec_tree.py::test_trees_on_the_gpu_stay_lossless_and_seeded_samples_repeat > $OUT/call2_tests.txt 2>&1
tail -4 $OUT/call2_tests.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=long -o log_cli=true --log-cli-level=WARNING \
    tests/test_spec_tree.py::test_trees_on_the_gpu_stay_lossless_and_seeded_samples_repeat > $OUT/call2_tree.txt 2>&1
tail -2 $OUT/call2_tree.txt
wait
for b in 32 1; do for tree in base head head base; do
  if [ $tree = base ]; then root=$PWD/.ab/s56/base; else root=$PWD; fi
  PYTHONPATH=$root timeout 120 python3 $root/benchmarks/bench_engine.py --model /tmp/v32 --batch $b --prompt-len 2112 \
      --steps 16 --rounds 2 --backends graph --json $OUT/call2_b${b}_$tree$RANDOM.json 2>&1 | grep "decode steps" | sed "s/^/b$b $tree /"
done; done

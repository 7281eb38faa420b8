#!/bin/bash
# Session 53, call 6: the experts' runs in one kernel (this tree) against the tree before (.ab/s53/base3,
# the router kernel already in): router and runs alone, engine decode on the v32 slice, GPU tests
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 &
ckpt=$!
timeout 120 python3 benchmarks/bench_router.py --json $OUT/router.json 2>&1 | grep -v '^{"date' | tail -16
wait $ckpt; echo "checkpoint rc $? at $(( $(date +%s) - start )) s"
run() {  # tree label batch
  local args="--model /tmp/v32 --batch $3 --prompt-len 2112 --steps 32 --rounds 2 --backends graph"
  if [ $1 = base ]; then PYTHONPATH=$PWD/.ab/s53/base3 timeout 150 python3 .ab/s53/base3/benchmarks/bench_engine.py $args
  else timeout 150 python3 benchmarks/bench_engine.py $args; fi 2>&1 | grep -v '^{' | grep "decode steps" | sed "s/^/$2 b$3 /"
}
run new new 32; run base base 32; run new new 32; run base base 32
echo "engine done at $(( $(date +%s) - start )) s"
timeout $(( 400 - $(date +%s) + start )) python3 -m pytest -q -m gpu tests/kernels/test_moe_runs.py tests/kernels/test_router.py tests/test_cuda_graphs.py tests/test_moe.py tests/test_models.py -p no:cacheprovider 2>&1 | tail -3

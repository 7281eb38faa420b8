#!/bin/bash
# Session 57, call 4: engine prefill, v32 slice FP8, this tree against a04bf2e, alternating processes
set -u
source .device/setup.sh && mkdir -p /tmp/dsa /tmp/dsa_base && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
ln -sfn "$PWD/.ab/s57/base/kernels" /tmp/dsa_base/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
t0=$SECONDS
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 > /dev/null 2>&1
echo "checkpoint $((SECONDS - t0)) s"
cp benchmarks/bench_prefill.py .ab/s57/base/benchmarks/
A="--model /tmp/v32 --prompt-len 8192 --batch 2 --rounds 3"
for i in 1 2; do
  t0=$SECONDS
  (cd benchmarks && timeout 130 python3 bench_prefill.py $A --json $OUT/call4_prefill_head$i.json 2>&1 | tail -1)
  echo "head $((SECONDS - t0)) s"; t0=$SECONDS
  (cd .ab/s57/base/benchmarks && PYTHONPATH=/tmp/dsa_base:$PWD/.. timeout 130 python3 bench_prefill.py $A --json $OUT/call4_prefill_base$i.json 2>&1 | tail -1)
  echo "base $((SECONDS - t0)) s"
done

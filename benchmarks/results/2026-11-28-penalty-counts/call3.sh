#!/bin/bash
# Session 53, call 3: penalty counts kept across steps (this tree) against b87fafc (.ab/s53/base):
# the sampler alone, then engine decode with a repetition penalty, then the GPU tests
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 &
ckpt=$!
for b in 1 32 64; do
  PYTHONPATH=$PWD/.ab/s53/base timeout 60 python3 .ab/s53/penalty_micro_old.py $b 2>&1 | tail -1 | sed 's/^/base /'
  timeout 60 python3 benchmarks/bench_penalties.py --batch $b 2>&1 | tail -1 | sed 's/^/new  /'
done | tee $OUT/micro.log
wait $ckpt; echo "checkpoint rc $? at $(( $(date +%s) - start )) s"
run() {  # tree label
  local args="--model /tmp/v32 --batch 32 --prompt-len 2112 --steps 32 --rounds 2 --backends graph,graph-sync --repetition-penalty 1.1"
  if [ $1 = base ]; then PYTHONPATH=$PWD/.ab/s53/base timeout 200 python3 .ab/s53/base/benchmarks/bench_engine.py $args --json $OUT/engine-$2.json
  else timeout 200 python3 benchmarks/bench_engine.py $args --json $OUT/engine-$2.json; fi 2>&1 | grep -v '^{' | tail -3
  echo "$2 done at $(( $(date +%s) - start )) s"
}
run new new1; run base base1
[ $(( $(date +%s) - start )) -lt 330 ] && { run new new2; run base base2; }
timeout 100 python3 -m pytest -q -m gpu tests/test_token_counts.py tests/test_overlap.py tests/test_sampling.py -p no:cacheprovider 2>&1 | tail -3
python3 - $OUT <<'PY'
import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/engine-*.json")):
    d = json.load(open(f))
    print(f.split("/")[-1], {k: v for k, v in d.items() if "tok" in k or "median" in k or "over" in k})
PY

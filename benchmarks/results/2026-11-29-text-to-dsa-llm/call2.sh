#!/usr/bin/env bash
# Session 68, call 2 (one H200): text straight to dsa_llm, tokenized on a pool of threads; the
# served benchmark at the default pacing (ensemble and dsa_llm), then dsa_llm without pacing.
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1; nproc; date -u
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
[ -d /tmp/v32 ] || python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
for run in "paced dsa_llm dsa" "unpaced dsa_llm"; do
  set -- $run; name=$1; shift
  extra=""; [ $name = unpaced ] && extra="--set max_responses_per_s=0"
  echo "=== served bench ($name): $*"; t0=$(date +%s)
  timeout 270 python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 32 64 128 --waves 4 --input-len 1024 \
    --output-len 128 --set warmup=false $extra --served-models "$@" --json $OUT/serving-$name.json > /tmp/$name.out 2>&1
  echo "rc $? in $(( $(date +%s) - t0 )) s"; grep -v Warning /tmp/$name.out | grep "tok/s" | cut -c1-200
  cp runs/bench_serving/tritonserver.log $OUT/$name-tritonserver.log 2>/dev/null
done

#!/usr/bin/env bash
# Session 68, call 5 (one H200): text straight to dsa_llm, unpaced, its requests asking for every
# output (as perf_analyzer does) against only those the client reads (dsa_llm builds only those).
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1; date -u
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
for outputs in all read all read; do
  flag=""; [ $outputs = all ] && flag="--all-outputs"
  echo "=== unpaced dsa_llm, outputs: $outputs"; t0=$(date +%s)
  timeout 150 python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 64 128 --waves 4 --input-len 1024 \
    --output-len 128 --set warmup=false --set max_responses_per_s=0 --served-models dsa_llm $flag \
    --json $OUT/serving-$outputs-$t0.json > /tmp/b.out 2>&1
  echo "rc $? in $(( $(date +%s) - t0 )) s"; grep -v Warning /tmp/b.out | grep "tok/s" | cut -c1-200
done

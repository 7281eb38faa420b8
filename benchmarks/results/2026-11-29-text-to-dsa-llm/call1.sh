#!/usr/bin/env bash
# Session 68, call 1 (one H200): text straight to dsa_llm — its served tests on the GPU, then the
# served benchmark sending the same text requests to the dsa ensemble and to dsa_llm, default pacing.
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1; nproc; date -u; git log --oneline -1 | cut -c1-60
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1 &
echo "=== served tests: text straight to dsa_llm, and the ensemble's pre/post models"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_text_direct.py \
  tests/serving/test_server_pre_post.py 2>&1 | tail -3
wait
echo "=== served bench: dsa and dsa_llm, default pacing"; t0=$(date +%s)
timeout 330 python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 32 64 128 --waves 4 --input-len 1024 \
  --output-len 128 --set warmup=false --served-models dsa dsa_llm --json $OUT/serving-direct.json > /tmp/b1.out 2>&1
echo "rc $? in $(( $(date +%s) - t0 )) s"; grep -v Warning /tmp/b1.out | grep "tok/s" | cut -c1-200
cp runs/bench_serving/tritonserver.log $OUT/b1-tritonserver.log 2>/dev/null

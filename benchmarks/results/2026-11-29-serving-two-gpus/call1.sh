#!/usr/bin/env bash
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader; date -u
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
echo "=== served bench, TP 2"; t0=$(date +%s)
timeout 330 python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 8 32 --waves 2 --input-len 1024 \
  --output-len 128 --set tensor_parallel_size=2 --set warmup=false --json $OUT/serving-tp2.json > /tmp/tp2.out 2>&1
echo "rc $? in $(( $(date +%s) - t0 )) s"; grep -v Warning /tmp/tp2.out | tail -4 | cut -c1-600
cp runs/bench_serving/tritonserver.log $OUT/tp2-tritonserver.log 2>/dev/null
grep -i "error\|exited\|ready\|rank" runs/bench_serving/tritonserver.log | tail -8 | cut -c1-300
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
echo "=== served bench, TP 1 (reply tensors' cost)"; t0=$(date +%s)
timeout 220 python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 32 64 --waves 4 --input-len 1024 \
  --output-len 128 --set warmup=false --repository runs/bs1/model_repository --json $OUT/serving-tp1.json > /tmp/tp1.out 2>&1
echo "rc $? in $(( $(date +%s) - t0 )) s"; grep -v Warning /tmp/tp1.out | tail -5 | cut -c1-300

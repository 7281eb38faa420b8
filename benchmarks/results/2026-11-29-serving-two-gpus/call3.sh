#!/usr/bin/env bash
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; date -u
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
echo "=== served data-parallel tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_data_parallel.py 2>&1 | tail -2
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
echo "=== served bench, one engine (reply tensors' cost)"; t0=$(date +%s)
timeout 200 python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 32 64 --waves 4 --input-len 1024 \
  --output-len 128 --set warmup=false --json $OUT/serving-dp1.json > /tmp/dp1.out 2>&1
echo "rc $? in $(( $(date +%s) - t0 )) s"; grep -v Warning /tmp/dp1.out | grep "tok/s" | cut -c1-200

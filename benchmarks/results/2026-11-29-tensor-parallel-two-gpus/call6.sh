#!/usr/bin/env bash
set -u
source .device/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader; date -u
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
echo "=== served TP on two GPUs"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_tensor_parallel.py 2>&1 | tail -3
grep -h "engine ready on device\|rank" /tmp/pytest-of-*/pytest-*/triton*/*.log 2>/dev/null | head -5
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
echo "=== served bench, TP 2"
timeout 330 python3 benchmarks/bench_serving.py --model /tmp/v32 --concurrency 8 32 --waves 2 --input-len 1024 \
  --output-len 128 --set tensor_parallel_size=2 --set warmup=false --json $OUT/serving-tp2.json 2>&1 \
  | grep -v Warning | tail -3 | cut -c1-1500

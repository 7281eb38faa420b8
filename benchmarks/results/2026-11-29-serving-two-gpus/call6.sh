#!/usr/bin/env bash
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; date -u
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
echo "=== served data-parallel tests (with the prefix router) and TP"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_data_parallel.py \
  tests/serving/test_server_tensor_parallel.py 2>&1 | tail -2

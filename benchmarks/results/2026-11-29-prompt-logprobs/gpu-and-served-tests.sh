#!/usr/bin/env bash
set -u
source .device/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader; date -u
echo "=== gpu tests"
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prompt_logprobs.py tests/test_overlap.py \
  tests/test_spec_chain.py tests/test_cuda_graphs.py tests/test_batch_invariance.py tests/test_samples.py \
  tests/test_sampling.py tests/test_spec_tree.py 2>&1 | tail -3
echo "=== served"
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_small_pool.py \
  tests/serving/test_server_queue_limit.py tests/serving/test_server_e2e.py \
  -k "not guide and not json and not choice and not regex" 2>&1 | tail -4

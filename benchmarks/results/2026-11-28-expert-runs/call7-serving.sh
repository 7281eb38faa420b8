#!/bin/bash
# Session 53, call 7: the end-to-end serving tests against a real tritonserver with dsa_llm on the GPU
# (penalties with kept counts, the router and runs kernels), packed without DeepGEMM / FlashMLA
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export DSA_STUB_ENV=/tmp/triton-stub-env
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels >/dev/null || exit 1
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_e2e.py 2>&1 | tail -6

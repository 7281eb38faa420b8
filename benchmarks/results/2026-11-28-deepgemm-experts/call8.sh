#!/bin/bash
# Session 57, call 8: the serving tests against a real tritonserver with dsa_llm on the GPU after
# the MoE and MLP changes (packed without DeepGEMM / FlashMLA, for the stub's numpy wheel)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export DSA_STUB_ENV=/tmp/triton-stub-env
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels >/dev/null || exit 1
timeout 220 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_e2e.py tests/serving/test_server_batching.py \
    tests/serving/test_server_speculative.py 2>&1 | tail -6 | tee $OUT/call8_serving.txt

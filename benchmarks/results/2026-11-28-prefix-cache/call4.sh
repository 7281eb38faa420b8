#!/bin/bash
# Session 54, call 4: GPU tests of overlap, CUDA graphs and chain drafting with the prefix cache on (in a
# process without test_batch_invariance, whose mode patches aten for the whole process), then the
# serving tests against a real tritonserver on the GPU (packed without DeepGEMM / FlashMLA)
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_overlap.py tests/test_cuda_graphs.py \
    tests/test_spec_chain.py 2>&1 | tail -3 | tee $OUT/call4_gpu_tests.txt
export DSA_STUB_ENV=/tmp/triton-stub-env
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels >/dev/null || exit 1
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_batching.py \
    tests/serving/test_server_e2e.py 2>&1 | tail -6 | tee $OUT/call4_serving.txt

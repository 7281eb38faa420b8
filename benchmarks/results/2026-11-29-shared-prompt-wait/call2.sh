#!/usr/bin/env bash
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl
python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
timeout 500 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py tests/test_spec_chain.py tests/test_cuda_graphs.py 2>&1 | tail -4

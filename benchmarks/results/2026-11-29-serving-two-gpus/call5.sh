#!/usr/bin/env bash
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
echo "=== the close test at e828f75 (before): must fail"
cp .ab/s67/old/engine.py dsa_backend/engine.py && cp .ab/s67/old/followers.py dsa_backend/followers.py
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_parallel.py -k two_gpus --durations=1 2>&1 | grep -v "^ \|^$" | tail -6 | cut -c1-200

#!/usr/bin/env bash
# Session 69, call 8 (one H200): the GPU-marked guided-decoding tests, with xgrammar in the pack.
set -u
source .device/setup.sh >/dev/null 2>&1 || { echo setup failed; exit 1; }
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_guided.py 2>&1 | grep -v "^\.\|Warning" | tail -8

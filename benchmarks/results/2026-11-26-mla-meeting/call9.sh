#!/bin/bash
# Call 9: the split model against the one-wave power-of-two split (split_ab.py), the sparse MLA GPU
# tests of the default path and the meeting, and the official decode section.
source .device/setup.sh >/dev/null 2>&1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $OUT/gpu.txt
AB_NAME=h100-split-ab.json python3 benchmarks/results/2026-11-26-mla-meeting/split_ab.py 2>&1 | tail -20
python3 benchmarks/bench_kernels.py --only ceilings,decode --budget 100 2>&1 | grep "| decode" | tail -12
python3 -m pytest -q -m gpu tests/kernels/test_sparse_mla.py tests/kernels/test_dispatch.py -x -k "meet or merge or invariant or default or sparse" 2>&1 | tail -3 | tee $OUT/gpu-tests.txt

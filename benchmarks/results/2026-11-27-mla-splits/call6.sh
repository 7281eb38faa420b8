#!/usr/bin/env bash
# Session 46, call 6: the new test against the kernels of 0cf19cc (must fail), and the sparse MLA A/B
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then exec bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; fi
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
mkdir -p /tmp/dsa_old && ln -sfn "$PWD/.ab/s46/oldk" /tmp/dsa_old/dsa_kernels
start=$(date +%s)
timeout 150 python3 -c "import sys; sys.path.insert(0, '/tmp/dsa_old'); import dsa_kernels; print(dsa_kernels.__file__); import pytest; sys.exit(pytest.main(['-q', '-m', 'gpu', '-p', 'no:cacheprovider', 'tests/kernels/test_specialization.py::test_split_counts_of_one_config_share_a_compiled_sparse_mla_kernel']))" 2>&1 | grep -v "^  " | tail -8
echo "old test $(( $(date +%s) - start )) s"
timeout 300 python3 .ab/s46/mla_ab.py $OUT/mla_ab.json 2>&1 | cut -c1-260 | tail -9
echo "ab $(( $(date +%s) - start )) s"

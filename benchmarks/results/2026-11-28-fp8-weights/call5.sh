#!/bin/bash
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 40 python3 .ab/s50/diag.py 2>&1 | grep -v "^[0-9]" | tail -4
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemm.py tests/test_fp8_weights.py > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -6
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs.py tests/kernels/test_dispatch.py > $OUT/tests_graphs.txt 2>&1
grep -v "^  " $OUT/tests_graphs.txt | tail -6

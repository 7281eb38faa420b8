#!/bin/bash
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset tiny --out /tmp/tiny > /dev/null 2>&1 || echo checkpoint failed
timeout 150 python3 benchmarks/results/2026-11-29-warmup-workers/loads_check.py /tmp/tiny 2>&1 | grep -v "^INFO" | tail -30
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_loads.py 2>&1 | tail -2

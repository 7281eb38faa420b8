#!/bin/bash
# Session 56, call 3: diagnostics of the two GPU tests that failed (warm-up on the H200, GPU trees)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
timeout 150 python3 .ab/s56/diag.py tree > $OUT/call3_tree.txt 2>&1; echo "tree rc $?"
grep -v "^  compiled" $OUT/call3_tree.txt | tail -30
timeout 240 python3 .ab/s56/diag.py warmup > $OUT/call3_warmup.txt 2>&1; echo "warmup rc $?"
cut -c1-400 $OUT/call3_warmup.txt | tail -30

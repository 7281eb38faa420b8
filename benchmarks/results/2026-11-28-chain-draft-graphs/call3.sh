#!/bin/bash
# Session 51, call 3: host profiles of spec and plain steps; FP8 + warm-up GPU tests; H200: call5 instead
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; exit 0; fi
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
echo "== checkpoint $(date +%T)"
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
for s in 2 0; do
  echo "== profile spec $s $(date +%T)"
  timeout 120 python3 benchmarks/results/2026-11-28-chain-draft-graphs/host_profile.py --model /tmp/v32 --spec $s --out $OUT/profile_spec$s.txt > $OUT/profile_spec$s.log 2>&1
  grep "a step unprofiled" $OUT/profile_spec$s.log
done
echo "== tests $(date +%T)"
left=$(( 570 - $(date +%s) + start ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_fp8_gemm.py tests/test_fp8_weights.py tests/test_warmup.py > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -12
date +%T

#!/usr/bin/env bash
# Session 45, call 7: compiles in the middle of serving after the change, the GPU tests it touches, and an A/B at the benchmark's shapes
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
[ -d /tmp/v32 ] || python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
start=$(date +%s)
TRITON_CACHE_DIR=/tmp/tcache_cold_$$ timeout 200 python3 .ab/s45/engine_compiles.py /tmp/v32 > $OUT/compiles.txt 2>&1; echo "compiles rc $? $(( $(date +%s) - start )) s"
awk '{ if ($1=="compile") print "  " $2, $3, $4; else print substr($0,1,100) }' $OUT/compiles.txt | head -70
timeout 120 python3 .ab/s45/spec_ab.py $OUT/spec_ab.json 2>&1 | tail -8; echo "ab $(( $(date +%s) - start )) s"
left=$(( 560 - $(date +%s) + start ))
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/kernels --ignore=tests/kernels/test_sparse_mla.py 2>&1 | grep -v "^  " | tee $OUT/gpu-tests.txt | tail -6
echo "tests $(( $(date +%s) - start )) s"

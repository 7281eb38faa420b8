#!/bin/bash
# Session 57, call 6: dense MLPs with gate and up stacked, the activation quantized in one pass:
# GPU tests, the MLP alone, then engine decode against b66a02b (alternating processes)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa /tmp/dsa_base && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
ln -sfn "$PWD/.ab/s57/base2/kernels" /tmp/dsa_base/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_weights.py tests/test_cuda_graphs.py 2>&1 | tail -3 | tee $OUT/call6_gpu_tests.txt
(cd benchmarks && timeout 100 python3 bench_fp8_gemm.py --only mlp --rows 1,32,128,1024 --json $OUT/call6_mlp.json 2>&1 | grep -v '^{"date' | tail -8)
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 > /dev/null 2>&1
for B in 32 1; do
  A="--model /tmp/v32 --batch $B --prompt-len 2112 --steps 16 --rounds 2 --backends graph"
  (cd benchmarks && timeout 110 python3 bench_engine.py $A --json $OUT/call6_b${B}_head.json 2>&1 | tail -1 | cut -c1-400)
  (cd .ab/s57/base2/benchmarks && PYTHONPATH=/tmp/dsa_base:$PWD/.. timeout 110 python3 bench_engine.py $A --json $OUT/call6_b${B}_base.json 2>&1 | tail -1 | cut -c1-400)
done

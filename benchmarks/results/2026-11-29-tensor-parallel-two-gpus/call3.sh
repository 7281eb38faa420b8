#!/usr/bin/env bash
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl
python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader; nvidia-smi topo -m | head -4
date -u
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /tmp/mk.log 2>&1 &
echo "=== two-GPU tests"
timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_parallel.py 2>&1 | tail -4
wait
for N in 2 1; do
  echo "=== bench_engine tp $N"
  timeout 140 python3 benchmarks/bench_engine.py --model /tmp/v32 --backends engine --tensor-parallel-size $N \
    --batch 32 --prompt-len 2304 --steps 32 --rounds 3 --json $OUT/tp$N.json 2>&1 | grep -v "Warning\|compiled kernel" | tail -2 | cut -c1-1500
done

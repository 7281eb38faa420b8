#!/usr/bin/env bash
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl
python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /tmp/mk.log 2>&1 &
echo "=== two-GPU test"; date -u
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_parallel.py -k "two_gpus" 2>&1 | tail -3
wait
echo "=== bench_engine tp 2"; date -u
timeout 170 python3 benchmarks/bench_engine.py --model /tmp/v32 --backends engine --tensor-parallel-size 2 \
    --batch 32 --prompt-len 2304 --steps 32 --rounds 2 --json $OUT/tp2.json > /tmp/tp2.log 2>&1; echo rc $?; date -u
grep -v "Warning\|compiled kernel\|^{" /tmp/tp2.log | tail -5 | cut -c1-300

#!/usr/bin/env bash
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl
python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
date -u
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1 || echo checkpoint failed
echo "=== burst: 16 requests behind one 2048-token prefix"
timeout 200 python3 benchmarks/bench_prefix_cache.py --model /tmp/v32 --prefix-len 2048 --suffix-len 64 --batch 16 \
  --max-tokens 16 --rounds 3 --json $OUT/burst.json 2>&1 | grep -v Warning | tail -16
echo "=== n=8 samples of a 1024-token prompt"
timeout 150 python3 benchmarks/bench_prefix_cache.py --model /tmp/v32 --prefix-len 1024 --suffix-len 0 --batch 8 \
  --max-tokens 32 --rounds 3 --json $OUT/samples.json 2>&1 | grep -v Warning | tail -16
echo "=== gpu tests"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_samples.py tests/test_overlap.py 2>&1 | tail -3

#!/usr/bin/env bash
# Guided decoding on the GPU: its tests, then the engine's decode throughput with and without guides.
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || { echo "installing pydantic"; python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl; }
python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
python3 -c "import xgrammar, pydantic; print('xgrammar', xgrammar.__version__, 'pydantic', pydantic.VERSION)"
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
OUT=${OUT:-/tmp/out}
echo "=== gpu tests $(date -u +%H:%M:%S)"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_guided.py 2>&1 | tail -15
echo "=== cpu tests of the module on this machine $(date -u +%H:%M:%S)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_guided.py -k "not speculation and not drafts" 2>&1 | tail -4
echo "=== checkpoint $(date -u +%H:%M:%S)"
timeout 150 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 >/dev/null
for b in 32 64; do
  echo "=== bench batch $b $(date -u +%H:%M:%S)"
  timeout 300 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch $b --prompt-len 2112 --steps 32 --rounds 3 \
    --backends engine,guided --json "$OUT/guided_b$b.json" 2>&1 | grep -v "^{" | tail -9
done
echo "=== done $(date -u +%H:%M:%S)"

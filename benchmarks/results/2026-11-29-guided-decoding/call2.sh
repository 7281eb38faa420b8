#!/usr/bin/env bash
# Guided decoding after the read back moved behind the forward and the fills onto threads.
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl
python3 -c "import xgrammar" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
git log --oneline -1
OUT=${OUT:-/tmp/out}
echo "=== gpu tests $(date -u +%H:%M:%S)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_guided.py tests/test_overlap.py 2>&1 | tail -4
[ -f /tmp/v32/config.json ] || timeout 150 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 >/dev/null
for b in 32 64; do
  echo "=== bench batch $b $(date -u +%H:%M:%S)"
  timeout 240 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch $b --prompt-len 2112 --steps 32 --rounds 3 \
    --backends engine,guided --json "$OUT/guided_b$b.json" 2>&1 | grep -v "^{" | grep -v "while serving" | tail -7
done
echo "=== bench batch 32, MTP chain of 2 $(date -u +%H:%M:%S)"
timeout 200 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 32 --rounds 2 \
  --speculative-num-steps 2 --backends engine,guided --json "$OUT/guided_b32_mtp2.json" 2>&1 | grep -v "^{" | grep -v "while serving" | tail -5
echo "=== done $(date -u +%H:%M:%S)"

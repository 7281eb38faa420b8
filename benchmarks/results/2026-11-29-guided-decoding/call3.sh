#!/usr/bin/env bash
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl
python3 -c "import xgrammar" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
OUT=${OUT:-/tmp/out}
[ -f /tmp/v32/config.json ] || timeout 150 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 >/dev/null
for b in 64 32; do
  echo "=== batch $b $(date -u +%H:%M:%S)"
  timeout 200 python3 .ab/s64/ab_fill.py $b 2>&1 | grep -v "while serving" | tail -1 | tee "$OUT/ab_fill_b$b.json"
done
echo "=== done $(date -u +%H:%M:%S)"

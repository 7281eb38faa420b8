#!/usr/bin/env bash
# Guided decoding's one-off host times on the device machine: the vocabulary index and compiles.
set -u
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
W=.ab/s64/wheels
python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps $W/pyd/*.whl
python3 -m pip install -q --no-index --no-deps $W/xgrammar-*.whl
OUT=${OUT:-/tmp/out}
timeout 60 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset tiny --out /tmp/tiny >/dev/null
for i in 1 2; do timeout 120 python3 .ab/s64/compile_times.py /tmp/tiny | tee "$OUT/compile_times_$i.json"; done

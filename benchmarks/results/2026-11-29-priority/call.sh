#!/usr/bin/env bash
set -u
source .device/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader; date -u
[ -d /tmp/v32 ] || python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
for b in 32 8; do
echo "=== priority, batch $b"
timeout 240 python3 benchmarks/bench_priority.py --model /tmp/v32 --batch $b --prompt-len 1024 --background-tokens 256 \
  --urgent-tokens 32 --rounds 3 --json $OUT/priority-batch$b.json 2>&1 | grep -v Warning | tail -7 | cut -c1-400
done

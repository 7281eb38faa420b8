#!/usr/bin/env bash
# Session 46, call 2: engine_rounds.py, three kernel rounds, with the GPU's clocks and power every 20 ms
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
[ -d /tmp/v32 ] || timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader -lms 20 > $OUT/smi.csv &
smi=$!
timeout 400 python3 .ab/s46/engine_rounds.py /tmp/v32 3 > $OUT/rounds.txt 2>&1
echo "rc $?"
kill $smi
grep -v '^{"t"' $OUT/rounds.txt | tail -12

#!/usr/bin/env bash
# Session 69, call 7 (two H200s): text straight to dsa_llm with two replicas, at the default pacing
# (max_responses_per_s=1000, shared by both replicas' streams) and unpaced, 128 streams of
# 1024/128; at the default pacing the ensemble (dsa) too, whose one postprocessing instance
# serves both replicas.
set -u
source .device/setup.sh >/dev/null 2>&1 || { echo setup failed; exit 1; }
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader; date -u
bash .ab/s69/stub_wheels.sh && python3 -m dsa_backend.serving.install --wheel-dir /tmp/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
load() {  # name model [options]: one level of 128 streams
  local name=$1 n=$2; shift 2
  timeout 120 python3 -m dsa_client.loadgen --model "$@" --concurrency 128 --num-requests $n --input-len 1024 \
    --output-len 128 --seed $RANDOM --out /tmp/load/$name --no-progress > /tmp/$name.txt 2>&1
  cp /tmp/load/$name/results.json $OUT/$name.json 2>/dev/null
  echo "$name: $(grep 'concurrency=' /tmp/$name.txt | cut -c1-200)"
}
for rate in 1000 0; do
  t0=$(date +%s)
  (setsid python3 -m dsa_backend.serving.serve --model /tmp/v32 --repository /tmp/r-$rate/model_repository \
    --set data_parallel_size=2 --set max_running_requests=128 --set max_responses_per_s=$rate --set warmup=false \
    > /tmp/serve-$rate.log 2>&1 &)
  for i in $(seq 120); do grep -q "serving /tmp" /tmp/serve-$rate.log && break; sleep 2; done
  echo "=== max_responses_per_s=$rate: ready in $(( $(date +%s) - t0 )) s"
  load warm-$rate 256 dsa_llm > /dev/null
  load direct-$rate 512 dsa_llm
  [ $rate = 1000 ] && load ensemble-$rate 512 dsa
  pkill -INT -f "dsa_backend.serving.serve"; sleep 6; pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub; sleep 2
done

#!/usr/bin/env bash
# Session 69, calls 4-6 (two H200s): what the prefix router gains on conversations. Two replicas
# (data_parallel_size=2) serving text straight to dsa_llm, conversations of 4 turns (each later
# turn resends the history: prompts of ~1K, 2K, 3K, 4K tokens), replica_routing=prefix against
# least_busy, one server each, the same seeded conversations at 32 and 64 in flight.
#   bash routing.sh TAG FIRST SECOND    (call 4: call4 prefix least_busy; call 5: call5 least_busy
#                                        prefix; call 6: call6 prefix least_busy)
set -u
source .device/setup.sh >/dev/null 2>&1 || { echo setup failed; exit 1; }
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader; nproc; date -u
bash .ab/s69/stub_wheels.sh && python3 -m dsa_backend.serving.install --wheel-dir /tmp/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
metric() { curl -s localhost:8002/metrics | awk -v m="$1" '$1 ~ "^"m {s += $2} END {print s + 0}'; }
tag=$1; shift
for routing in "$@"; do
  t0=$(date +%s)
  (setsid python3 -m dsa_backend.serving.serve --model /tmp/v32 --repository /tmp/r-$routing/model_repository \
    --set data_parallel_size=2 --set replica_routing=$routing --set max_running_requests=64 --set warmup=false \
    > /tmp/serve-$routing.log 2>&1 &)
  for i in $(seq 120); do grep -q "serving /tmp" /tmp/serve-$routing.log && break; sleep 2; done
  grep -o "replica_routing[^,]*" /tmp/r-$routing/model_repository/dsa_llm/config.pbtxt | head -1
  echo "=== $routing: ready in $(( $(date +%s) - t0 )) s"
  timeout 120 python3 -m dsa_client.loadgen --model dsa_llm --concurrency 64 --num-requests 128 --input-len 1024 \
    --output-len 64 --seed 999 --out /tmp/warm-$routing --no-progress > /tmp/warm-$routing.txt 2>&1
  echo "warm-up: $(grep 'concurrency=' /tmp/warm-$routing.txt | cut -c1-120)"
  for c in 32 64; do
    before=$(metric dsa_prefix_cache_hit_tokens_total)
    timeout 150 python3 -m dsa_client.loadgen --model dsa_llm --concurrency $c --num-requests $((2 * c)) --turns 4 \
      --input-len 1024 --output-len 64 --seed $c --out /tmp/load-$routing-$c --no-progress > /tmp/load-$routing-$c.txt 2>&1
    cp /tmp/load-$routing-$c/results.json $OUT/$routing-$c-$tag.json
    echo "$routing c=$c: $(grep 'concurrency=' /tmp/load-$routing-$c.txt | cut -c1-230); server cache hit tokens +$(( $(metric dsa_prefix_cache_hit_tokens_total) - before ))"
  done
  curl -s localhost:8002/metrics | grep -E "^dsa_(requests_admitted|prompt_tokens)_total|^dsa_prefix" > $OUT/metrics-$routing-$tag.txt
  pkill -INT -f "dsa_backend.serving.serve"; sleep 6; pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub; sleep 2
done

#!/usr/bin/env bash
# Session 69, call 3 (call 2 again, more rounds, each pair in both orders) (one H200): one server, unpaced (max_responses_per_s=0), text straight to
# dsa_llm at 128 streams, 1024/128: requests asking for only the outputs the client reads against
# requests asking for every output (as perf_analyzer does), interleaved over three rounds; then
# the ensemble (dsa) at the same load, for the per-delta cost of postprocessing at this code.
set -u
source .device/setup.sh >/dev/null 2>&1 || { echo setup failed; exit 1; }
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1; date -u
bash .ab/s69/stub_wheels.sh && python3 -m dsa_backend.serving.install --wheel-dir /tmp/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
[ -d /tmp/v32 ] || python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
(setsid python3 -m dsa_backend.serving.serve --model /tmp/v32 --repository /tmp/ps/model_repository \
  --set max_running_requests=128 --set max_responses_per_s=0 --set warmup=false > /tmp/ps.log 2>&1 &)
for i in $(seq 150); do grep -q "serving /tmp" /tmp/ps.log && break; sleep 2; done
stats() { curl -s localhost:8000/v2/models/stats | python3 -c '
import json, sys
for m in json.load(sys.stdin)["model_stats"]:
    s = m["inference_stats"]; n = s["success"]["count"]
    print(m["name"], n, *(round(s[k]["ns"] / max(n, 1) / 1e3, 1) for k in ("queue", "compute_infer")))'; }
load() {  # name model [--all-outputs] -> one level of 512 requests at 128 streams
  local name=$1; shift
  timeout 150 python3 -m dsa_client.loadgen --url 127.0.0.1:8001 --model "$@" --concurrency 128 --num-requests 512 \
    --input-len 1024 --output-len 128 --seed $RANDOM --out /tmp/load/$name --no-progress > /tmp/$name.txt 2>&1
  cp /tmp/load/$name/results.json $OUT/$name.json
  echo "$name: $(grep 'concurrency=' /tmp/$name.txt | cut -c1-200)"
}
load warmup dsa_llm
for round in 4 5 6 7; do
  if [ $((round % 2)) = 0 ]; then load r$round-all dsa_llm --all-outputs; load r$round-wanted dsa_llm
  else load r$round-wanted dsa_llm; load r$round-all dsa_llm --all-outputs; fi
done
cp /tmp/ps.log $OUT/serve.log
pkill -INT -f "dsa_backend.serving.serve"; sleep 8; pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub; true

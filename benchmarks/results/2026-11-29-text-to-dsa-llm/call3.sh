#!/usr/bin/env bash
# Session 68, call 3 (one H200): where a direct text stream's TTFT goes at 128 streams: the
# server's own TTFT histogram (arrival to the first token's output) against the client's, for
# dsa_llm direct and the ensemble; py-spy on the dsa_llm stub under the direct load.
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
python3 -m pip install -q --no-index --no-deps .ab/s68/tools/py_spy*.whl
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
[ -d /tmp/v32 ] || python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
(setsid python3 -m dsa_backend.serving.serve --model /tmp/v32 --repository /tmp/ps/model_repository --set max_running_requests=128 \
  --set warmup=false > /tmp/ps.log 2>&1 &)
for i in $(seq 120); do grep -q "serving /tmp" /tmp/ps.log && break; sleep 2; done
ttft() { curl -s localhost:8002/metrics | awk '/^dsa_time_to_first_token_seconds_(sum|count)/ {print $2}' | paste -sd' '; }
for model in dsa_llm dsa dsa_llm; do
  before=$(ttft)
  (timeout 150 python3 -m dsa_client.loadgen --url 127.0.0.1:8001 --model $model --concurrency 128 --num-requests 768 \
     --input-len 1024 --output-len 128 --seed $RANDOM --out /tmp/load-$model --no-progress > /tmp/load-$model.txt 2>&1; echo done > /tmp/load-$model.done) &
  if [ ! -f $OUT/llm.raw ] && [ $model = dsa_llm ]; then
    sleep 12; llm=$(pgrep -f "dsa_llm/1/model.py" | head -1)
    timeout 20 py-spy record --pid $llm --duration 6 --format raw --threads --nonblocking -o $OUT/llm.raw 2>&1 | tail -1
    timeout 20 py-spy record --pid $llm --duration 6 --format raw --threads --gil --nonblocking -o $OUT/llm_gil.raw 2>&1 | tail -1
    top -b -n 1 -H -p $llm | head -30 > $OUT/top_llm.txt
  fi
  wait
  after=$(ttft)
  echo "=== $model: server ttft (sum count) before [$before] after [$after]"
  grep "concurrency=" /tmp/load-$model.txt | cut -c1-220
done
cp /tmp/ps.log $OUT/serve.log
pkill -INT -f "dsa_backend.serving.serve"; sleep 8; pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub

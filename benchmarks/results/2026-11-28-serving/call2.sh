#!/bin/bash
# Session 59, call 2: served vs engine alone with one response a request per sender pass; py-spy on the stubs under load
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
python3 -m pip install -q --no-index --no-deps .ab/s59/tools/py_spy*.whl
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels 2>&1 | tail -1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 > /dev/null 2>&1 || echo checkpoint failed
echo "checkpoint $(( $(date +%s) - t0 )) s"
cd benchmarks
timeout 330 python3 bench_serving.py --model /tmp/v32 --concurrency 1 8 32 64 --waves 4 --input-len 1024 --output-len 128 \
    --repository /tmp/bs/model_repository --json $OUT/call2_serving.json > $OUT/call2_serving.txt 2>&1
echo "rc $? after $(( $(date +%s) - t0 )) s"
grep -v '^{"bench' $OUT/call2_serving.txt | grep -v Warning | tail -12
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/call2_serving.json"))
for l in d["levels"]:
    e, s = l["engine"], l["served"]
    print(l["concurrency"], "tok/s %.0f / %.0f = %s" % (s["output_tokens_per_s"] or 0, e["output_tokens_per_s"], l["served_over_engine_tokens_per_s"]),
          "itl p50 %.2f / %.2f ms" % (1e3 * (s["itl_s"]["p50"] or 0), 1e3 * e["itl_s"]["p50"]),
          "ttft p50 %.1f / %.1f ms" % (1e3 * (s["ttft_s"]["p50"] or 0), 1e3 * e["ttft_s"]["p50"]), "errors", s["errors"])
PY
cd ..
# py-spy on the stubs while 64 streams run
(setsid python3 -m dsa_backend.serving.serve --model /tmp/v32 --repository /tmp/ps/model_repository --set max_running_requests=64 > /tmp/ps.log 2>&1 &)
for i in $(seq 90); do grep -q "serving /tmp" /tmp/ps.log && break; sleep 2; done
(timeout 150 python3 -m dsa_client.loadgen --url 127.0.0.1:8001 --concurrency 64 --num-requests 1024 --input-len 1024 --output-len 128 --out /tmp/load64 --no-progress > $OUT/call2_load64.txt 2>&1 &)
sleep 15
llm=$(pgrep -f "dsa_llm/1/model.py" | head -1); post=$(pgrep -f "postprocessing/1/model.py" | head -1)
timeout 20 py-spy record --pid $llm --duration 6 --format raw --threads --nonblocking -o $OUT/call2_llm.raw 2>&1 | tail -1
timeout 20 py-spy record --pid $llm --duration 6 --format raw --threads --gil --nonblocking -o $OUT/call2_llm_gil.raw 2>&1 | tail -1
timeout 20 py-spy record --pid $post --duration 6 --format raw --nonblocking -o $OUT/call2_post.raw 2>&1 | tail -1
timeout 10 py-spy dump --pid $llm > $OUT/call2_llm_dump.txt 2>&1
curl -s localhost:8000/v2/models/stats > $OUT/call2_model_stats.json
top -b -n 2 -d 2 | tail -30 > $OUT/call2_top.txt
pkill -INT -f "dsa_backend.serving.serve"; sleep 8; pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub
tail -3 $OUT/call2_load64.txt

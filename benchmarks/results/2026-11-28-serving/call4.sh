#!/bin/bash
# Session 59, call 4: replies in four tensors (reply_layout); served vs engine alone; serving e2e tests on the GPU
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels 2>&1 | tail -1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 > /dev/null 2>&1 || echo checkpoint failed
echo "checkpoint $(( $(date +%s) - t0 )) s"
cd benchmarks
timeout 250 python3 bench_serving.py --model /tmp/v32 --concurrency 1 8 32 64 --waves 4 --input-len 1024 --output-len 128 \
    --repository /tmp/bs/model_repository --json $OUT/call4_serving.json > $OUT/call4_serving.txt 2>&1
echo "rc $? after $(( $(date +%s) - t0 )) s"
python3 - $OUT/call4_serving.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for l in d["levels"]:
    e, s = l["engine"], l["served"]
    p = s.get("triton_models", {}).get("postprocessing", {})
    print(l["concurrency"], "tok/s %.0f / %.0f = %s" % (s["output_tokens_per_s"] or 0, e["output_tokens_per_s"], l["served_over_engine_tokens_per_s"]),
          "itl p50 %.2f / %.2f ms" % (1e3 * (s["itl_s"]["p50"] or 0), 1e3 * e["itl_s"]["p50"]),
          "ttft p50 %.1f / %.1f ms" % (1e3 * (s["ttft_s"]["p50"] or 0), 1e3 * e["ttft_s"]["p50"]), "errors", s["errors"], "post", p)
PY
cd ..
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_e2e.py tests/serving/test_server_pre_post.py 2>&1 | tail -4 | tee $OUT/call4_gpu_tests.txt
echo "done $(( $(date +%s) - t0 )) s"

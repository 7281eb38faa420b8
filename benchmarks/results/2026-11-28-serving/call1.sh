#!/bin/bash
# Session 59, call 1: the served engine (tritonserver, dsa ensemble, gRPC streams) against the engine alone
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels 2>&1 | tail -2
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
nproc
t0=$(date +%s)
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 > /dev/null 2>&1 || echo checkpoint failed
echo "checkpoint $(( $(date +%s) - t0 )) s"
cd benchmarks
timeout 420 python3 bench_serving.py --model /tmp/v32 --concurrency 1 8 32 64 --waves 4 --input-len 1024 --output-len 128 \
    --repository /tmp/bs/model_repository --json $OUT/call1_serving.json > $OUT/call1_serving.txt 2>&1
echo "rc $? after $(( $(date +%s) - t0 )) s"
grep -v '^{"bench' $OUT/call1_serving.txt | grep -v Warning | tail -25
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/call1_serving.json"))
for l in d["levels"]:
    e, s = l["engine"], l["served"]
    print(l["concurrency"], "tok/s %.0f / %.0f = %s" % (s["output_tokens_per_s"] or 0, e["output_tokens_per_s"], l["served_over_engine_tokens_per_s"]),
          "itl p50 %.2f / %.2f ms" % (1e3 * (s["itl_s"]["p50"] or 0), 1e3 * e["itl_s"]["p50"]),
          "ttft p50 %.1f / %.1f ms" % (1e3 * (s["ttft_s"]["p50"] or 0), 1e3 * e["ttft_s"]["p50"]), "errors", s["errors"])
PY
cp /tmp/bs/tritonserver.log $OUT/call1_tritonserver.log 2>/dev/null; tail -5 /tmp/bs/tritonserver.log

#!/bin/bash
# Session 62, call 2: served vs alone, engine process + postprocessing cancel-check throttle (new) against 1c9006b (old), A B A
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo /tmp/dsa > "$site/zz_dsa.pth"
export DSA_STUB_ENV=/tmp/triton-stub-env
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels 2>&1 | tail -1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
nproc
t0=$(date +%s)
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 > /dev/null 2>&1 || echo checkpoint failed
echo "checkpoint $(( $(date +%s) - t0 )) s"
root=$PWD
bench() {  # label tree
  echo "$2" > "$site/zz_device_project.pth"
  (cd "$2/benchmarks" && timeout 240 python3 bench_serving.py --model /tmp/v32 --concurrency 1 32 64 --waves 6 \
      --input-len 1024 --output-len 128 --set warmup=false --repository /tmp/bs_$1/model_repository \
      --json $OUT/$1.json > $OUT/$1.txt 2>&1; echo "$1 rc $? after $(( $(date +%s) - t0 )) s")
  grep -c "dsa-engine\|engine process" /tmp/bs_$1/tritonserver.log
  python3 - $OUT/$1.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for l in d["levels"]:
    e, s = l["engine"], l["served"]
    p = s.get("triton_models", {}).get("postprocessing", {})
    print(l["concurrency"], "post infer %s in %s out %s" % (p.get("compute_infer_us"), p.get("compute_input_us"), p.get("compute_output_us")), "tok/s %.0f / %.0f = %s" % (s["output_tokens_per_s"] or 0, e["output_tokens_per_s"], l["served_over_engine_tokens_per_s"]),
          "itl p50 %.2f / %.2f ms" % (1e3 * (s["itl_s"]["p50"] or 0), 1e3 * e["itl_s"]["p50"]),
          "ttft p50 %.1f / %.1f ms" % (1e3 * (s["ttft_s"]["p50"] or 0), 1e3 * e["ttft_s"]["p50"]), "errors", s["errors"],
          "post n %s q %s" % (p.get("requests"), p.get("queue_us")))
PY
}
bench new "$root"
bench old "$root/.ab/s62/old"
bench new2 "$root"
echo "$root" > "$site/zz_device_project.pth"
cp /tmp/bs_new/tritonserver.log $OUT/new_tritonserver.log
echo "done $(( $(date +%s) - t0 )) s"

#!/bin/bash
# Session 62, call 3: max_responses_per_s 0 / 1000 / 2000, and 2 postprocessing instances (batched), at 32 and 64 streams
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo /tmp/dsa > "$site/zz_dsa.pth"
export DSA_STUB_ENV=/tmp/triton-stub-env
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels 2>&1 | tail -1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 > /dev/null 2>&1 || echo checkpoint failed
echo "checkpoint $(( $(date +%s) - t0 )) s"
bench() {  # label, then --set values
  label=$1; shift
  sets=(); for kv in "$@"; do sets+=(--set "$kv"); done
  (cd benchmarks && timeout 150 python3 bench_serving.py --model /tmp/v32 --concurrency 32 64 --waves 6 \
      --input-len 1024 --output-len 128 --set warmup=false "${sets[@]}" --repository /tmp/bs_$label/model_repository \
      --json $OUT/$label.json > $OUT/$label.txt 2>&1; echo "$label rc $? after $(( $(date +%s) - t0 )) s")
  python3 - $OUT/$label.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for l in d["levels"]:
    e, s = l["engine"], l["served"]
    p = s.get("triton_models", {}).get("postprocessing", {})
    print(l["concurrency"], "tok/s %.0f / %.0f = %s" % (s["output_tokens_per_s"] or 0, e["output_tokens_per_s"], l["served_over_engine_tokens_per_s"]),
          "itl p50 %.2f p90 %.2f / %.2f ms" % (1e3 * (s["itl_s"]["p50"] or 0), 1e3 * (s["itl_s"]["p90"] or 0), 1e3 * e["itl_s"]["p50"]),
          "ttft p50 %.1f / %.1f ms" % (1e3 * (s["ttft_s"]["p50"] or 0), 1e3 * e["ttft_s"]["p50"]), "e2e p50 %.0f ms" % (1e3 * s["e2e_s"]["p50"]), "errors", s["errors"],
          "post n %s q %s infer %s" % (p.get("requests"), p.get("queue_us"), p.get("compute_infer_us")))
PY
}
bench r0
bench r1000 max_responses_per_s=1000
bench r2000 max_responses_per_s=2000
bench pp2 postprocessing_instance_count=2
echo "done $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
set -u
source .device/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader; date -u
echo "=== gpu tests"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prompt_logprobs.py 2>&1 | tail -3
[ -d /tmp/v32 ] || python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1
for shape in "16 2048" "4 8192"; do set -- $shape
echo "=== scoring $1 x $2"
timeout 150 python3 benchmarks/bench_scoring.py --model /tmp/v32 --batch $1 --prompt-len $2 --rounds 3 \
  --json $OUT/scoring-$1x$2.json 2>&1 | grep -v Warning | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('median_batch_ms','scored_over_plain','lm_head_gemm_ms','extra_over_lm_head_gemm')})"
done

#!/usr/bin/env bash
# GPU checks for one device call, from the repository root, carrying .device (see gpu-pack):
#   bash benchmarks/device_checks.sh gpu-tests serving engine topk spec   (gpu-tests-mla: sparse MLA's tests;
#   gpu-tests-warmup: the start-up warm-up's, ~2 minutes with a cold Triton cache; gpu-tests-model: the
#   model's against transformers, the routed experts', sampling's, the decode CUDA graphs')
# Each stage is bounded by its own timeout so that one stuck stage still leaves the others' output.
set -u
source .device/setup.sh || exit 1
# dsa_kernels and dsa_client are installed under those names on the CPU machine; link them here.
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
OUT=${OUT:-/tmp/out}
for stage in "$@"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  case $stage in
    gpu-tests)
      # batch_invariant patches aten for its whole process: its tests get a process of their own.
      # The whole suite takes ~9.5 minutes on an H100, so sparse MLA's tests are a stage of their own
      # (gpu-tests-mla) and each stage fits one device call.
      timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -25
      # 402 s for these on a fresh H100 with Triton's cache cold (forty-seventh session)
      timeout 440 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/kernels \
        --ignore=tests/kernels/test_sparse_mla.py 2>&1 | grep -v "^  " | tail -60 ;;
    gpu-tests-mla)
      timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_mla.py 2>&1 \
        | grep -v "^  " | tail -30 ;;
    gpu-tests-model)
      timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_models.py tests/test_moe.py \
        tests/test_sampling.py tests/test_cuda_graphs.py tests/test_fp8_weights.py 2>&1 | tail -8 ;;
    gpu-tests-warmup)
      timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_warmup.py 2>&1 | tail -8 ;;
    serving)
      export DSA_STUB_ENV=/tmp/triton-stub-env
      python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels >/dev/null || exit 1
      timeout 420 python3 -m pytest -q -p no:cacheprovider tests/serving 2>&1 | tail -25 ;;
    engine)
      timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice \
        --out /tmp/v32 --fp8 >/dev/null
      timeout 300 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 \
        --json "$OUT/bench_engine.json" 2>&1 | tail -5
      timeout 180 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 \
        --backends kernel --batch-invariant --json "$OUT/bench_engine_batch_invariant.json" 2>&1 | tail -3 ;;
    spec)
      timeout 420 python3 benchmarks/bench_spec.py --out "$OUT/spec" --train-steps 300 2>&1 | tail -16 ;;
    indexer-sweep)
      timeout 300 python3 benchmarks/sweep_indexer.py --json "$OUT/sweep_indexer.json" 2>&1 | tail -8 ;;
    mla-pairs)
      timeout 300 python3 benchmarks/bench_mla_pairs.py --json "$OUT/mla_pairs.json" 2>&1 | tail -12
      timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_mla.py 2>&1 \
        | grep -v "^  " | tail -30 ;;
    mla-balanced)
      timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_mla.py 2>&1 \
        | grep -v "^  " | tail -30
      timeout 300 python3 benchmarks/bench_mla_balanced.py --json "$OUT/mla_balanced.json" 2>&1 | tail -24 ;;
    mla-sweep)
      timeout 300 python3 benchmarks/sweep_sparse_mla.py --json "$OUT/sweep_sparse_mla.json" 2>&1 | tail -12 ;;
    topk)
      timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_topk.py 2>&1 | tail -5
      mkdir -p "$OUT/topk" && OUT="$OUT/topk" timeout 240 python3 benchmarks/bench_kernels.py --only topk --budget 200 \
        2>&1 | tail -40 ;;
    mla)
      mkdir -p "$OUT/mla" && OUT="$OUT/mla" timeout 300 python3 benchmarks/bench_kernels.py --only ceilings,decode,prefill \
        --budget 260 2>&1 | grep -v '"check"' | tail -40 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done

#!/usr/bin/env bash
set -u
source .ab/s66/dev/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; date -u
python3 -m dsa_backend.serving.install --wheel-dir .ab/s66/dev/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
echo "=== TP close, GPU test"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_parallel.py -k two_gpus 2>&1 | tail -2
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset tiny --out /tmp/tiny > /dev/null 2>&1
timeout 150 python3 - <<'PY'
import time
from dsa_backend import LLM, SamplingParams
for graphs in (False, True):
    llm = LLM("/tmp/tiny", tensor_parallel_size=2, num_kv_pages=256, warmup=False, cuda_graph=graphs)
    llm.generate(["a b c d"] * 4, SamplingParams(max_tokens=16, temperature=0))
    procs = llm.engine.followers._processes
    t = time.monotonic(); llm.close()
    print(f"cuda_graph={graphs}: close {time.monotonic() - t:.2f} s, follower exit codes {[p.exitcode for p in procs]}", flush=True)
PY
echo "=== served TP test, then the unload"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_tensor_parallel.py 2>&1 | tail -2
grep -h "did not stop\|Exit timeout\|shutting down with\|terminate called" /tmp/pytest-of-*/pytest-*/triton*/*.log 2>/dev/null | cut -c1-160

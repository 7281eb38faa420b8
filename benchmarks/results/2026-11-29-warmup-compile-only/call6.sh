source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
export DSA_STUB_ENV=/tmp/triton-stub-env
python3 -m dsa_backend.serving.install --wheel-dir .device/stub-wheels 2>&1 | tail -1
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset tiny --out /tmp/tiny > /dev/null 2>&1 || echo ckpt failed
timeout 240 python3 -m dsa_backend.serving.demo --model /tmp/tiny --out /tmp/demo 2>&1 | tail -12
grep -i "warm-up\|while serving\|engine ready\|error" /tmp/demo/tritonserver.log | cut -c1-300 | tail -20
cp /tmp/demo/tritonserver.log $OUT/ 2>/dev/null

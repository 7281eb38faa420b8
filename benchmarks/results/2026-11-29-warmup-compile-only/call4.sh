source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
cd benchmarks
timeout 200 python3 bench_warmup.py --limits 64 2048 163840 --threads 16 --warm --json $OUT/warmup-default.json > $OUT/bench-default.txt 2>&1; echo bench default rc $?
timeout 110 python3 bench_warmup.py --limits 8 256 16384 --threads 16 --check --json $OUT/warmup-small.json > $OUT/bench-small.txt 2>&1; echo bench small rc $?
cd ..
timeout 230 python3 -m pytest -q -m gpu -x tests/kernels/test_compile_only.py tests/test_warmup.py tests/kernels/test_topk.py tests/test_attention.py -p no:cacheprovider > $OUT/gpu-tests.txt 2>&1; echo tests rc $?
tail -5 $OUT/gpu-tests.txt; cat $OUT/bench-default.txt $OUT/bench-small.txt | grep -v "^\s*$" | tail -c 3000

source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
timeout 400 python3 .ab/s61/probe2.py 64 2048 163840 16 2>&1 | grep -v "^\s*$" > $OUT/call3.txt; echo rc $?
timeout 120 python3 .ab/s61/probe2.py 8 256 16384 8 2>&1 | grep -v "^\s*$" > $OUT/call3b.txt; echo rc $?
grep -v " dsa_backend.warmup " $OUT/call3.txt | tail -c 6000; grep "warm-up" $OUT/call3.txt; grep "RESULT\|warm-up" $OUT/call3b.txt

source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
timeout 420 python3 .ab/s61/probe2.py 64 2048 163840 16 2>&1 | grep -v "^\s*$" > $OUT/call2.txt; echo rc $?
timeout 150 python3 .ab/s61/probe2.py 8 256 16384 4 2>&1 | grep -v "^\s*$" > $OUT/call2b.txt; echo rc $?
grep -v " dsa_backend.warmup " $OUT/call2.txt | tail -c 9000; grep "RESULT\|warm-up" $OUT/call2b.txt

source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nproc; nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
timeout 580 python3 .ab/s61/probe.py '[["8 256 16384", 16, 1, 170], ["64 2048 163840", 16, 0, 240], ["8 256 16384", 0, 0, 150]]' 2>&1 | tee $OUT/call1.txt

# call 2: next_n 4's configs with the head sum on the tensor cores (key chunk, stages, schedule)
set -e
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv
NEW_ONLY=1 NO_DEEPGEMM=1 NEXT_N=1,4 VARIANT_NEXT_N=4 REPS=4 VARIANTS='{
 "k512s2": {"OVERLAP": false, "STAGES": 2, "UNROLLED": false, "KEYS_PER_PROG": 512},
 "k1024s2": {"OVERLAP": false, "STAGES": 2, "UNROLLED": false, "KEYS_PER_PROG": 1024},
 "k2048s2": {"OVERLAP": false, "STAGES": 2, "UNROLLED": false, "KEYS_PER_PROG": 2048},
 "k1024s3": {"OVERLAP": false, "STAGES": 3, "UNROLLED": false, "KEYS_PER_PROG": 1024},
 "k1024s4": {"OVERLAP": false, "STAGES": 4, "UNROLLED": false, "KEYS_PER_PROG": 1024},
 "k1024u2": {"OVERLAP": false, "STAGES": 2, "UNROLLED": true, "KEYS_PER_PROG": 1024}}' \
  timeout 540 python3 benchmarks/results/2026-11-26-head-sum-mma/hs_ab.py

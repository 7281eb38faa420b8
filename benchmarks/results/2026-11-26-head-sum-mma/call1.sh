# call 1: the head sum on the tensor cores against the committed kernel, every decode shape
set -e
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv
VARIANTS='{"one": {"OVERLAP": false, "STAGES": 2, "UNROLLED": true, "KEYS_PER_PROG": 1024}}' REPS=3 \
  timeout 520 python3 benchmarks/results/2026-11-26-head-sum-mma/hs_ab.py

#!/bin/bash
# EXPERIMENT: the pair with the scorer's 156-byte spill (HEAD's cta_pair.py) against the 40-byte build
# (the working tree's), alternating, each run's pairs against the same one-CTA kernel and FlashMLA.
source .device/setup.sh
rm -rf /tmp/oldk && cp -r kernels /tmp/oldk && cp .ab/cta_pair_old.py /tmp/oldk/cta_pair.py
mkdir -p /tmp/dsa
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
for i in 1 2; do
  for v in old new; do
    if [ $v = old ]; then ln -sfn /tmp/oldk /tmp/dsa/dsa_kernels; else ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels; fi
    echo "== $v $i"
    timeout 120 python3 benchmarks/bench_mla_pairs.py --batches 64,128 --json $OUT/spill_$v$i.json 2>&1 | tail -2
  done
done

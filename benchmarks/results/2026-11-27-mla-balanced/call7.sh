set -u
echo "== meeting check"
PYTHONPATH=$PWD/.ab/vmeet timeout 150 python3 .ab/meet_check.py 2>&1 | tail -6 | cut -c1-300
echo "== bench: main (merge launch), meeting, twice"
S="128:34,40,67,80,90,100;64:67,133,180"
for k in main meet main meet; do
  PYTHONPATH=$PWD/.ab/v$k timeout 150 python3 benchmarks/bench_mla_balanced.py --shapes "$S" --json "$OUT/bal_$k.json" 2>&1 | python3 -c "
import sys, json
for l in sys.stdin:
    if l.startswith('{'):
        r = json.loads(l); print('$k', r['heads'], r['batch'], 'bal', min(r['balanced_us']), 'split', min(r['split_us']), 'flash', min(r['flashmla_us']), 'err', round(r['rel_err'], 5))
    else: print(l.rstrip()[:200])
"
done
cp -r .ab/vmeet/dsa_kernels/* kernels/
echo "== gpu tests (sparse mla, pairs)"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_mla.py tests/kernels/test_cta_pair.py 2>&1 | grep -v "^  " | tail -5 | cut -c1-300

"""Whether a streamed top-k's time varies with the data: a copy of kernels/topk_cooperative.py against the
three launches, alone in CUDA graphs, on four seeds of randn rows and of the Gluon indexer's logits.
On the device, from the repository root: python3 THIS_FILE VARIANT [ROWSxWIDTH ...]
(h100-3: .ab/stream.py, the prototype of streamed-spans-prototype.diff, default shapes;
 h100-4: the same with MAX_SPAN 16 slices and a loop that is not unrolled, 128x131072 128x65536
 128x32768 32x131072 on two seeds)."""
import sys, json, os, torch, triton.testing
sys.path.insert(0, "benchmarks")
import topk_ab as ab
stream = ab.load_variant("stream", sys.argv[1])
from dsa_kernels import topk
res = []
shapes = [tuple(map(int, a.split("x"))) for a in sys.argv[2:]] or [(128, 32768), (32, 131072), (64, 32768)]
for n, w in shapes:
    for seed in range(4):
        torch.manual_seed(seed)
        case, lens, table = ab.indexer_case(n, w, ab.indexer_logits.indexer_gluon)
        for src in ("indexer", "randn"):
            logits = case() if src == "indexer" else torch.randn(n, w, device="cuda")
            want = ab.expected(logits, lens, table)
            row = dict(shape=[n, w], seed=seed, src=src)
            for name, mod in (("stream", stream), ("three", topk)):
                run = ab.runner(mod, n, w)
                got = run(logits, lens, table)
                row[name + "_exact"] = bool(torch.equal(got, want))
                row[name + "_us"] = round(ab.graph_us(lambda: run(logits, lens, table)), 2)
            print(json.dumps(row), flush=True)
            res.append(row)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "stream_var.json"), "w"), indent=1)

"""Where the streaming prototype's time varies: 128 / 32K and 32 / 128K, several data seeds, alone (CUDA graph)
and the program count; randn rows and the Gluon indexer's logits."""
import sys, json, os, torch, triton.testing
sys.argv += []
sys.path.insert(0, "benchmarks")
import topk_ab as ab
stream = ab.load_variant("stream", sys.argv[1])
from dsa_kernels import topk
res = []
for n, w in [(128, 131072), (128, 65536), (128, 32768), (32, 131072)]:
    for seed in range(2):
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

"""Compact table of a topk_ab.json: per shape and kernel, mean over rounds of alone / behind / share."""
import json, os, sys, collections
r = json.load(open(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "topk_ab.json")))
print(r["gpu"], r["date"], r["argv"])
bad = [c for c in r["checks"] if c["wrong"]]
print("checks:", len(r["checks"]), "wrong:", bad[:10])
rows = collections.defaultdict(list)
for x in r["rows"]:
    rows[(tuple(x["shape"]), x["kernel"], x["indexer"])].append(x)
for (shape, kernel, idx), xs in rows.items():
    m = lambda k: sum(x[k] for x in xs) / len(xs)
    print(f"{shape[0]:4d}/{shape[1]:6d} {kernel:22s} idx {xs[0]['indexer_us']:7.1f} alone {m('alone_us'):6.2f} "
          f"behind {m('behind_us'):6.2f} [{' '.join(str(x['behind_us']) for x in xs)}] share {m('share_behind'):.3f} exact {all(x['exact'] for x in xs)}")
print(r["notes"])

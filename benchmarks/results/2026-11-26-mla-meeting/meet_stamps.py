"""Clock stamps of the meeting (a copy of kernels/ with `stamps.patch`, under .ab/stamped): per
program, SM cycles from the kernel's start to the join, the arrival, the end of the wait and the
end of the merge; and the globaltimer spread of the joins across the grid. Eager calls after a
warm-up, medians over the programs of the last of five calls. Writes $OUT/$AB_NAME."""
import json, os, statistics, sys, time
sys.path.insert(0, ".ab/stamped")
import torch
from dsa_kernels_stamped import dispatch, sparse_mla, sparse_mla_gluon as g

SCALE, SLOTS = 576 ** -0.5, 262144
torch.manual_seed(0)
pool = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(pool, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
rows = []
for heads, n in ((128, 32), (128, 16), (64, 16), (128, 1)):
    q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    split = sparse_mla.mla_config(n, heads, 2048)["SPLIT"]
    grid = n * split * heads // 64
    g.STAMPS = torch.zeros(grid, 8, dtype=torch.int64, device="cuda")
    for _ in range(5):
        sparse_mla.sparse_mla(q, pool, idx, SCALE)
    torch.cuda.synchronize()
    st = g.STAMPS.cpu().double()
    med = lambda x: round(statistics.median(x.tolist()), 1)
    r = dict(heads=heads, n=n, split=split, grid=grid,
             cycles_to_join=med(st[:, 1] - st[:, 0]), arrive=med(st[:, 2] - st[:, 1]), wait=med(st[:, 3] - st[:, 2]),
             wait_max=float((st[:, 3] - st[:, 2]).max()), merge=med(st[:, 4] - st[:, 3]),
             merge_max=float((st[:, 4] - st[:, 3]).max()),
             join_spread_ns=float(st[:, 5].max() - st[:, 5].min()), wait_end_spread_ns=float(st[:, 6].max() - st[:, 6].min()),
             last_join_to_last_end_ns=float(st[:, 7].max() - st[:, 5].max()))
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("AB_NAME", "meet_stamps.json")), "w"), indent=1)

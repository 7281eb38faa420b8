"""How much of a split decode is the merge launch: the whole op, the Gluon kernel alone, the merge alone."""
import json, os, time, torch, triton, triton.testing
from dsa_kernels import dispatch, sparse_mla, sparse_mla_gluon
SCALE = 576 ** -0.5
SLOTS = 262144
def ms(fn):
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")) * 1e3
torch.manual_seed(0)
fp8 = torch.zeros(SLOTS, 656, dtype=torch.uint8, device="cuda")
dispatch.store_mla_kv(fp8, torch.randn(SLOTS, 512, device="cuda"), torch.randn(SLOTS, 64, device="cuda"),
                      torch.arange(SLOTS, device="cuda"))
views = (fp8.view(torch.float8_e4m3fn), fp8.view(torch.float32), fp8.view(torch.bfloat16))
rows = []
for heads, n in ((128, 32), (128, 16), (64, 32), (64, 16), (128, 1), (64, 1), (128, 64)):
    q = torch.randn(n, heads, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, SLOTS, (n, 2048), device="cuda").int()
    split = sparse_mla.mla_config(n, heads, 2048)["SPLIT"]
    kps = triton.cdiv(triton.cdiv(2048, split), 64) * 64
    part = torch.empty(n, split, heads, 512, device="cuda")
    plse = torch.empty(n, split, heads, device="cuda")
    out = torch.empty(n, heads, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(n, heads, device="cuda")
    main = lambda: sparse_mla_gluon.launch(q, views, 656, SLOTS, idx, 2048, part if split > 1 else out,
                                           plse if split > 1 else lse, SCALE * 1.4426950408889634, kps, split, True)
    cfg = sparse_mla.merge_config(split)
    merge = lambda: sparse_mla._merge_splits_kernel[(n * heads * (512 // cfg["BLOCK_D"]),)](
        part, plse, out, lse, split, H=heads, SPLITS=triton.next_power_of_2(split), **cfg)
    whole = lambda: sparse_mla.sparse_mla(q, fp8, idx, SCALE)
    r = dict(heads=heads, n=n, split=split)
    for _ in range(2):
        for name, fn in (("whole", whole), ("main", main), ("merge", merge),
                         ("flashmla", lambda: dispatch._flashmla_decode(q, fp8, idx, SCALE))):
            if name == "merge" and split == 1:
                continue
            r.setdefault(name, []).append(round(ms(fn), 2))
    rows.append(r); print(json.dumps(r), flush=True)
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "merge_share.json"), "w"), indent=1)

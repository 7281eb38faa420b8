"""Per-phase SM clocks of the cooperative top-k: apply clock64-stamps.patch to a copy
(patch -o .ab/topk_coop_stamped.py kernels/topk_cooperative.py benchmarks/results/2026-11-25-topk-cooperative/clock64-stamps.patch),
then on the device: source .device/setup.sh && python3 benchmarks/results/2026-11-25-topk-cooperative/trace_coop.py
Stamps: 0 start, 1 sample min/max, per round r < 3: 2+3r histogram stored, 3+3r met, 4+3r bookkeeping done;
11 after the loop (pairwise path), 12 gather met, 13 output written."""
import importlib.util, json, os, sys
import torch
from dsa_kernels import reference, topk
spec = importlib.util.spec_from_file_location("dsa_kernels.topk_coop_stamped", ".ab/topk_coop_stamped.py")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
K, PAGE, SMS = 2048, 64, torch.cuda.get_device_properties(0).multi_processor_count
res = {"gpu": torch.cuda.get_device_name(0), "shapes": []}
for n, w in [(32, 32768), (16, 32768), (8, 32768), (1, 32768), (1, 131072)]:
    parts = m.device_parts(n, w, SMS)
    logits = torch.randn(n, w, device="cuda")
    lens = torch.full((n,), w, device="cuda", dtype=torch.int32)
    table = torch.randperm(n * w // PAGE, device="cuda").view(n, -1).int()
    m.DBG = torch.zeros(n * parts * 16, device="cuda", dtype=torch.int64)
    out = torch.empty(n, K, device="cuda", dtype=torch.int32)
    for _ in range(20):
        m.DBG.zero_()
        assert m.cooperative_topk(logits, lens, None, K, parts, out, topk.TRANSFORM_PAGED, table, PAGE, 1, None)
    torch.cuda.synchronize()
    ok = torch.equal(out, reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, K), table, PAGE))
    d = m.DBG.view(n * parts, 16).cpu()
    rel = (d - d[:, :1]).float()
    med = rel.median(dim=0).values.tolist()
    mx = rel.max(dim=0).values.tolist()
    row = dict(shape=[n, w], parts=parts, exact=ok, median_cycles=[round(x) for x in med], max_cycles=[round(x) for x in mx])
    res["shapes"].append(row)
    print(json.dumps(row), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "trace_coop.json"), "w"), indent=1)

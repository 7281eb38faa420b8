"""Nineteenth session, H100 (benchmarks/results/2026-11-25-topk-sample-runs/). Set up from the repository root:
cp kernels/topk_cooperative.py .ab/base.py; patch -o .ab/topk_runs8.py .ab/base.py sample-runs-only.diff;
git apply sample-runs-design-effect.patch; cp smooth_ab.py .ab/. The cooperative top-k on rows whose neighbours are alike (moving averages of randn), where a
sample of runs of neighbouring keys says less than its size: the committed kernel (.ab/base.py,
strided sample), runs without the design effect (.ab/topk_runs8.py) and kernels/topk_cooperative.py.
CUDA graphs, alone.  python3 .ab/smooth_ab.py"""
import importlib.util, json, os, sys, time
import torch, triton.testing
from dsa_kernels import reference, topk
from dsa_kernels import topk_cooperative as new

K, PAGE = 2048, 64
SMS = torch.cuda.get_device_properties(0).multi_processor_count
OUT = os.environ.get("OUT", "/tmp")


def load(name, path):
    spec = importlib.util.spec_from_file_location(f"dsa_kernels.ab_{name}", path)
    m = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


variants = {"base": load("base", ".ab/base.py"), "runs8": load("runs8", ".ab/topk_runs8.py"), "new": new}
res = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), rows=[])
g = torch.Generator(device="cuda").manual_seed(0)


def rows_of(kind, n, w):
    x = torch.randn(n, w + 63, device="cuda", generator=g)
    if kind == "randn":
        return x[:, :w].contiguous()
    win = int(kind[6:])
    return torch.nn.functional.avg_pool1d(x.view(n, 1, -1), win, stride=1)[:, 0, :w].contiguous() * win ** 0.5


for n, w in ((32, 32768), (16, 32768), (8, 32768), (4, 131072), (8, 131072)):
    for kind in ("randn", "smooth8", "smooth32"):
        x = rows_of(kind, n, w)
        lens = torch.full((n,), w, device="cuda", dtype=torch.int32)
        table = torch.randperm(n * w // PAGE, device="cuda")[: n * w // PAGE].view(n, -1).int()
        want = reference.paged_transform_ref(reference.topk_positions_ref(x, lens, K), table, PAGE)
        row = dict(shape=[n, w], kind=kind)
        for name, m in variants.items():
            parts = m.parts_per_row(n, w, SMS)
            out = torch.full((n, K), -7, device="cuda", dtype=torch.int32)

            def run():
                assert m.cooperative_topk(x, lens, None, K, parts, out, topk.TRANSFORM_PAGED, table, PAGE, 1, None)
            run()
            row[f"{name}_exact"] = bool(torch.equal(out, want))
            row[f"{name}_us"] = round(float(triton.testing.do_bench_cudagraph(run, rep=30, return_mode="median")) * 1e3, 2)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
with open(os.path.join(OUT, "smooth_ab.json"), "w") as f:
    json.dump(res, f, indent=1)

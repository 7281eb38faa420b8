"""ForwardBatch.build, base (b65d86f) against the current tree, on the GPU: decode and chain-verify batches of 32."""
import importlib.util, json, statistics, sys, time
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod); return mod

new = load("dsa_backend/batch.py", "batch_new")
base = load(".ab/s51/base/dsa_backend/batch.py", "batch_base")
dev = torch.device("cuda")
B, ctx, page = 32, 2112, 64
pages = [list(range(r * 40, r * 40 + 35)) for r in range(B)]
res = {}
for n in (1, 3):
    ids = [[1000 + r] * n for r in range(B)]
    prefix = [ctx + r for r in range(B)]
    for tag, mod in (("base", base), ("new", new), ("base", base), ("new", new)):
        mode = mod.ForwardMode.DECODE if n == 1 else mod.ForwardMode.TARGET_VERIFY
        times = []
        for _ in range(300):
            torch.cuda.synchronize(); t = time.perf_counter()
            mod.ForwardBatch.build(mode, ids, prefix, pages, page, dev, all_logits=n > 1)
            times.append(time.perf_counter() - t)
        res[f"n{n}_{tag}"] = round(1e3 * statistics.median(times[50:]), 4)
print(json.dumps(res))

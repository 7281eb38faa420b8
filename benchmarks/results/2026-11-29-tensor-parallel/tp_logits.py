"""Device check: a prefill's logits from two ranks on the one GPU (gloo), from one rank, and from
one rank in float32 on the reference backend (the exact math); each error against that."""
import json, os, sys
import torch
import torch.multiprocessing as mp
sys.path.insert(0, "tests")
from checkpoints import random_prompts
from dsa_backend.attention import TorchDsaBackend
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.models import load_model
from dsa_backend.parallel import TensorParallel, free_port, join_group

GPU = torch.cuda.is_available()
PROMPTS = random_prompts([64, 100, 257, 512, 31, 700, 128, 400] if GPU else [5, 9, 30], seed=3)
DEV = torch.device("cuda", 0) if GPU else torch.device("cpu")

@torch.inference_mode()
def logits(path, tp, prompts=(PROMPTS,), exact=False):
    dtype = torch.float32 if exact else torch.bfloat16
    model, info = load_model(path, dtype, DEV, keep_fp8=not exact, tp=tp)
    if exact:
        model.backend = TorchDsaBackend()
    cache = KVCache(model.config, 128, 64, dtype=dtype, kv_cache_dtype="auto", mtp_has_indexer=info.mtp_has_indexer,
                    device=DEV, index_fp8=False if exact else None)
    out = []
    for group in prompts:
        pages = [cache.allocator.allocate(pages_needed(len(p), 64)) for p in group]
        batch = ForwardBatch.build(ForwardMode.EXTEND, group, [0] * len(group), pages, 64, DEV)
        out.append(model(batch, cache).logits.float().cpu())
        for p in pages:
            cache.allocator.free(p)
    del model, cache
    torch.cuda.empty_cache() if GPU else None
    return torch.cat(out)

def worker(rank, port, path, out):
    os.environ["DSA_TP_SHARE_ONE_GPU"] = "1"
    x = logits(path, join_group(rank, 2, port, DEV))
    if rank == 0:
        torch.save(x, out)

def compare(a, b):
    same = (a.argmax(-1) == b.argmax(-1))
    return {"rel_err": round(float((a - b).norm() / b.norm()), 5), "max_abs": round(float((a - b).abs().max()), 4),
            "argmax_equal": f"{int(same.sum())}/{len(same)}"}

if __name__ == "__main__":
    res = {}
    for path in sys.argv[1:]:
        exact = logits(path, TensorParallel(), exact=True)
        one = logits(path, TensorParallel())
        alone = logits(path, TensorParallel(), [[p] for p in PROMPTS])
        out = f"/tmp/tp2_{os.path.basename(path)}.pt"
        mp.spawn(worker, args=(free_port(), path, out), nprocs=2)
        two = torch.load(out)
        top2 = exact.topk(2, dim=-1).values
        res[path] = {"one rank vs exact": compare(one, exact), "two ranks vs exact": compare(two, exact),
                     "one rank, prompts one at a time, vs exact": compare(alone, exact),
                     "two ranks vs one": compare(two, one), "one at a time vs batched": compare(alone, one),
                     "exact top1 - top2": [round(float(g), 4) for g in top2[:, 0] - top2[:, 1]],
                     "exact logits std": round(float(exact.std()), 4)}
        print(path, json.dumps(res[path], indent=1), flush=True)
    json.dump(res, open(os.environ.get("OUT", "/tmp") + "/tp_logits.json", "w"), indent=1)

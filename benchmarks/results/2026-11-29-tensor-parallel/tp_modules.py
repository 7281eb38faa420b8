"""Device check, one process: each layer's attention and MLP on the whole model against the sum of
its two ranks' shares (models loaded with TensorParallel(rank, 2), no group), on the same input."""
import json, os, sys
import torch
sys.path.insert(0, "tests")
from checkpoints import random_prompts
from dsa_backend.attention import default_backend
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.models import load_model
from dsa_backend.parallel import TensorParallel

GPU = torch.cuda.is_available()
PROMPTS = random_prompts([64, 100, 257, 512, 31, 700, 128, 400] if GPU else [5, 9, 30], seed=3)
DEV = torch.device("cuda", 0) if GPU else torch.device("cpu")

def rel(a, b):
    return round(float((a.float() - b.float()).norm() / b.float().norm()), 6)

@torch.inference_mode()
def check(path, dtype):
    models = [load_model(path, dtype, DEV, keep_fp8=True, tp=tp)[0]
              for tp in (TensorParallel(), TensorParallel(0, 2), TensorParallel(1, 2))]
    caches, batches = [], []
    for m in models:
        cache = KVCache(m.config, 128, 64, dtype=dtype, kv_cache_dtype="auto", device=DEV)
        pages = [cache.allocator.allocate(pages_needed(len(p), 64)) for p in PROMPTS]
        caches.append(cache)
        batches.append(ForwardBatch.build(ForwardMode.EXTEND, PROMPTS, [0] * len(PROMPTS), pages, 64, DEV))
    backend = default_backend(DEV)
    full = models[0]
    cos, sin = full.rotary(batches[0].positions)
    x = full.model.embed_tokens(batches[0].input_ids)
    topks = [None, None, None]
    out = []
    for i in range(len(full.model.layers)):
        layers = [m.model.layers[i] for m in models]
        h = layers[0].input_layernorm(x)
        attn = []
        for j, (layer, cache, batch) in enumerate(zip(layers, caches, batches)):
            a, topks[j] = layer.self_attn(h, cos, sin, batch, cache, backend, topks[j])
            attn.append(a)
        same_topk = all(torch.equal(topks[0], t) for t in topks[1:])
        x = x + attn[0]
        h = layers[0].post_attention_layernorm(x)
        mlp = [layer.mlp(h) for layer in layers]
        out.append({"layer": i, "topk_equal": same_topk,
                    "attention: shares' sum vs whole": rel(attn[1].float() + attn[2].float(), attn[0]),
                    "mlp: shares' sum vs whole": rel(mlp[1].float() + mlp[2].float(), mlp[0])})
        x = x + mlp[0]
    return out

if __name__ == "__main__":
    res = {}
    for path in sys.argv[1:]:
        res[path] = {str(d): check(path, d) for d in ((torch.bfloat16, torch.float32) if GPU else (torch.float32, torch.bfloat16))}
        print(path, json.dumps(res[path], indent=1), flush=True)
        torch.cuda.empty_cache() if GPU else None
    json.dump(res, open(os.environ.get("OUT", "/tmp") + "/tp_modules.json", "w"), indent=1)

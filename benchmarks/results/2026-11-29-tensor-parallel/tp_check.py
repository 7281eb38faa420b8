"""Device check: tensor_parallel_size 2 with both ranks on the one GPU (gloo), against one rank."""
import json, os, sys, time
import torch
sys.path.insert(0, "tests")
from checkpoints import random_prompts
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling_params import SamplingParams

def run(path, size, graph, fp8w="auto"):
    if size > 1:
        os.environ["DSA_TP_SHARE_ONE_GPU"] = "1"
    t = time.time()
    e = Engine(EngineArgs(model=path, num_kv_pages=512, tensor_parallel_size=size, cuda_graph=graph,
                          max_num_batched_tokens=1024, fp8_weights=fp8w))
    init = time.time() - t
    prompts = random_prompts([64, 100, 257, 512, 31, 700, 128, 400], seed=3)
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        e.add_request(str(i), p, params)
    toks = {str(i): [] for i in range(len(prompts))}
    t = time.time()
    while e.has_work():
        for o in e.step():
            toks[o.request_id] += o.new_token_ids
    gen = time.time() - t
    e.close()
    os.environ.pop("DSA_TP_SHARE_ONE_GPU", None)
    torch.cuda.empty_cache()
    return toks, init, gen

def agree(a, b):
    first = sum(a[k][0] == b[k][0] for k in a)
    prefix = [next((i for i, (x, y) in enumerate(zip(a[k], b[k])) if x != y), len(a[k])) for k in a]
    return {"first_token_equal": f"{first}/{len(a)}", "equal_prefix_lengths": prefix,
            "all_equal": a == b}

if __name__ == "__main__":
    out = {}
    for path in sys.argv[1:]:
        ref, i1, g1 = run(path, 1, True)
        eager, i2, g2 = run(path, 1, False)
        tp2, i3, g3 = run(path, 2, False)
        out[path] = {"tp1_graphs_vs_tp1_eager": agree(ref, eager), "tp1_graphs_vs_tp2": agree(ref, tp2),
                     "tp1_eager_vs_tp2": agree(eager, tp2),
                     "seconds(init, generate)": {"tp1 graphs": [i1, g1], "tp1 eager": [i2, g2], "tp2 one gpu": [i3, g3]}}
        print(path, json.dumps(out[path], indent=1), flush=True)
    json.dump(out, open(os.environ.get("OUT", "/tmp") + "/tp_check.json", "w"), indent=1)

"""Session 56 call 3: why the warm-up test compiles after warm-up on the H200, and why the GPU tree test fails."""
import logging, random, sys, traceback
sys.path.insert(0, "tests")
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
import torch, triton
what = sys.argv[1]

if what == "warmup":
    from dsa_backend import warmup
    from dsa_backend.attention import default_backend, shared_page_walk
    from dsa_backend.batch import ForwardBatch, ForwardMode
    from dsa_backend.cache import KVCache, pages_needed
    from dsa_backend.config import ModelConfig
    from dsa_backend.tools.make_checkpoint import make_config
    from dsa_kernels.indexer_logits import gluon_paged_config, gluon_paged_runs
    config = ModelConfig.from_dict(make_config("deepseek_v32", "v32-slice"))
    cache = KVCache(config, 320, 64, dtype=torch.bfloat16, kv_cache_dtype="auto", device="cuda")
    running, budget, longest = 8, 256, 16384
    compiled = []
    triton.knobs.runtime.jit_cache_hook = lambda **kw: compiled.append((kw["fn"].name, kw["repr"])) and False
    warmup.warm_up(cache, config, warmup.WarmupShapes(running, budget, longest, tokens_per_verify=2))
    print("warm-up compiled", len(compiled), "kernels;", sorted({n for n, _ in compiled}))
    print("triton paged configs compiled in warm-up:", [r for n, r in compiled if n == "_paged_logits_kernel"][:5])
    compiled.clear()
    backend, rng = default_backend("cuda"), random.Random(0)
    for step in range(48):
        mode = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND)[step % 3]
        requests = rng.randint(1, running)
        if mode is ForwardMode.EXTEND:
            new = [rng.choice([1, rng.randint(2, budget // requests)]) for _ in range(requests)]
        else:
            new = [1 if mode is ForwardMode.DECODE else 2] * requests
        lengths = [rng.randint(n + 1, longest // running) for n in new]
        pages = [cache.allocator.allocate(pages_needed(n, 64)) for n in lengths]
        batch = ForwardBatch.build(mode, [[0] * n for n in new], [s - n for s, n in zip(lengths, new)], pages, 64,
                                   "cuda", all_logits=mode is ForwardMode.TARGET_VERIFY)
        q = torch.randn(batch.num_tokens, config.index_n_heads, 128, device="cuda").bfloat16()
        w = torch.randn(batch.num_tokens, config.index_n_heads, device="cuda")
        layer = next(iter(cache.indexer.index_of_layer))
        topk = backend.indexer_topk(q, w, cache.indexer, layer, batch, config.index_topk, 128 ** -0.5)
        qa = torch.randn(batch.num_tokens, config.num_attention_heads, 576, device="cuda").bfloat16()
        backend.sparse_mla(qa, cache.mla, 0, batch, topk, 576 ** -0.5)
        for p in pages:
            cache.allocator.free(p)
        if compiled:
            print("step", step, mode.name, new, lengths, "max_seq_len", batch.max_seq_len, "walk", shared_page_walk(batch),
                  "gluon runs", gluon_paged_runs(torch.device("cuda"), 64),
                  "gluon cfg", gluon_paged_config(torch.device("cuda"), len(new), batch.max_seq_len, 2, 64))
            for n, r in compiled:
                print("  compiled", n, r[:1500])
            compiled.clear()
    print("steps done")
else:
    from dsa_backend.engine import Engine, EngineArgs
    from dsa_backend.sampling_params import SamplingParams
    from dsa_backend.tools.make_checkpoint import make_config, write_checkpoint
    from checkpoints import random_prompts
    from test_engine import run_all
    import pathlib
    path = pathlib.Path("/tmp/ckpt_v32_tiny")
    if not path.exists():
        write_checkpoint(make_config("deepseek_v32", "tiny"), path)
    PROMPTS = random_prompts([20, 45, 70, 100, 33, 64, 90, 12], seed=31)
    GREEDY = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)

    def cuda_engine(dtype, **spec):
        return Engine(EngineArgs(model=str(path), device="cuda", dtype=dtype, page_size=16, num_kv_pages=512, **spec))

    tree = dict(speculative_algorithm="eagle", speculative_num_steps=3, speculative_eagle_topk=2)
    requests = {f"r{i}": (p, GREEDY) for i, p in enumerate(PROMPTS)}
    for dtype in ("float32", "bfloat16"):
        try:
            a = run_all(cuda_engine(dtype, **tree), requests)
            b = run_all(cuda_engine(dtype), requests)
            for r in a:
                same = next((i for i, (x, y) in enumerate(zip(a[r], b[r])) if x != y), None)
                print(dtype, r, "tree == plain" if a[r] == b[r] else f"first difference at {same}", len(a[r]), len(b[r]))
        except Exception:
            traceback.print_exc()
    sampled = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True)
    try:
        runs = []
        for _ in range(2):
            e = cuda_engine("bfloat16", **tree)
            runs.append(run_all(e, {f"s{i}": (p, sampled) for i, p in enumerate(PROMPTS[:4])}))
            print("pages free", e.scheduler.pages.num_available, "of", e.num_kv_pages)
        print("sampled runs equal", runs[0] == runs[1], [len(t) for t in runs[0].values()])
        for r in runs[0]:
            print(r, runs[0][r][:12], runs[1][r][:12])
    except Exception:
        traceback.print_exc()

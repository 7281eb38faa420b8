"""The DSA attention backends: the kernel backend against the reference, on the same pools.

On the CPU, KernelDsaBackend runs through dsa_kernels' CPU path (the references), which checks
what it adapts at the boundary: folded scales, the ragged key buffer of EXTEND, the next_n and
per-token block tables of the paged modes, positions <-> slots, padded heads. The GPU tests
(marked gpu) run the Triton / DeepGEMM / FlashMLA kernels against the reference on the same GPU.
"""

from __future__ import annotations

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend.attention import (KernelDsaBackend, TorchDsaBackend, default_backend, per_token_context_lens,
                                   ragged_pieces, shared_page_walk)
from dsa_backend.batch import ForwardBatch, ForwardMode, TreeLayout
from dsa_backend.cache import KVCache, pages_needed
from dsa_backend.config import ModelConfig
from dsa_backend.tools.make_checkpoint import make_config

PAGE = 4
TOPK = 8
HEADS = 16


@pytest.fixture(scope="module")
def config():
    return ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))


def _filled_cache(config, kv_cache_dtype, lengths, seed=0):
    """A cache holding random keys and latents for requests of these lengths, and their pages."""
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(config, 64, PAGE, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype)
    pages = [cache.allocator.allocate(pages_needed(n, PAGE)) for n in lengths]
    prefill = ForwardBatch.build(ForwardMode.EXTEND, [[1] * n for n in lengths], [0] * len(lengths), pages, PAGE)
    slots = prefill.out_cache_loc
    for layer in cache.indexer.index_of_layer:
        cache.indexer.store(layer, slots, torch.randn(len(slots), 128, generator=gen))
    cache.mla.store(0, slots, torch.randn(len(slots), 512, generator=gen), torch.randn(len(slots), 64, generator=gen))
    return cache, pages


def _batches(lengths, pages):
    """One batch per mode over requests whose KV already holds `lengths` tokens."""
    yield ForwardBatch.build(ForwardMode.EXTEND, [[1] * n for n in lengths], [0] * len(lengths), pages, PAGE)
    yield ForwardBatch.build(ForwardMode.DECODE, [[1]] * len(lengths), [n - 1 for n in lengths], pages, PAGE)
    yield ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[1] * 3] * len(lengths), [n - 3 for n in lengths], pages, PAGE)
    uneven = [1 + r % 3 for r in range(len(lengths))]
    yield ForwardBatch.build(ForwardMode.DRAFT_EXTEND, [[1] * u for u in uneven],
                             [n - u for n, u in zip(lengths, uneven)], pages, PAGE)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "auto"])
def test_kernel_backend_topk_and_attention_equal_the_reference_in_every_mode(config, kv_cache_dtype):
    lengths = [5, 13, 21]  # one shorter than TOPK (dense), two sparse
    cache, pages = _filled_cache(config, kv_cache_dtype, lengths)
    layer = next(iter(cache.indexer.index_of_layer))
    gen = torch.Generator().manual_seed(1)
    for batch in _batches(lengths, pages):
        q = torch.randn(batch.num_tokens, HEADS, 128, generator=gen)
        w = torch.randn(batch.num_tokens, HEADS, generator=gen)
        want = TorchDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1)
        got = KernelDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1)
        assert got.shape == want.shape == (batch.num_tokens, TOPK), batch.mode
        assert torch.equal(got, want), batch.mode  # both ascending, -1 padded
        visible = per_token_context_lens(batch)
        assert ((got < visible) | (got == -1)).all()
        qa = torch.randn(batch.num_tokens, 4, 576, generator=gen).bfloat16()  # 4 heads: padded to 64
        out_ref = TorchDsaBackend().sparse_mla(qa, cache.mla, 0, batch, want, 0.05)
        out = KernelDsaBackend().sparse_mla(qa, cache.mla, 0, batch, got, 0.05)
        assert out.shape == (batch.num_tokens, 4, 512) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), out_ref.float(), rtol=0, atol=1e-2)


def _recorded_mla_calls(monkeypatch) -> list:
    """(kernel, pool dtype, pool rows) of each sparse MLA call the kernel backend makes."""
    import dsa_kernels

    calls = []
    for name in ("sparse_mla_prefill", "sparse_mla_decode"):
        kernel = getattr(dsa_kernels, name)
        monkeypatch.setattr(dsa_kernels, name, lambda q, kv, idx, scale, _k=kernel, _n=name: calls.append(
            (_n, kv.dtype, kv.shape[0])) or _k(q, kv, idx, scale))
    return calls


def test_an_fp8_prefill_step_gathers_its_rows_for_the_prefill_kernel(config, monkeypatch):
    import dsa_kernels
    from dsa_backend import attention

    lengths = [5, 13, 21]
    cache, pages = _filled_cache(config, "fp8", lengths)
    layer = next(iter(cache.indexer.index_of_layer))
    monkeypatch.setattr(attention, "MIN_GATHERED_HEAD_ROWS", 1)
    monkeypatch.setattr(dsa_kernels, "sparse_mla_prefill_on_flashmla", lambda q, topk: True)  # FlashMLA's place
    calls = _recorded_mla_calls(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    # a whole prompt each, then chunks behind a prefix of 4 (whose rows are gathered too)
    for prefix in (0, 4):
        batch = ForwardBatch.build(ForwardMode.EXTEND, [[1] * (n - prefix) for n in lengths], [prefix] * 3, pages, PAGE)
        q = torch.randn(batch.num_tokens, HEADS, 128, generator=gen)
        topk = TorchDsaBackend().indexer_topk(q, torch.randn(batch.num_tokens, HEADS, generator=gen), cache.indexer,
                                              layer, batch, TOPK, 0.1)
        qa = torch.randn(batch.num_tokens, 4, 576, generator=gen).bfloat16()
        monkeypatch.setattr(attention, "GATHERED_ROWS_PER_TOKEN", 128)
        calls.clear()
        out = KernelDsaBackend().sparse_mla(qa, cache.mla, 0, batch, topk, 0.05)
        assert calls == [("sparse_mla_prefill", torch.bfloat16, sum(lengths))]
        want = TorchDsaBackend().sparse_mla(qa, cache.mla, 0, batch, topk, 0.05)
        # the gathered K and V are rounded to bf16, the reference's are not: the FP8 bound
        assert float((out.float() - want.float()).norm() / want.float().norm()) < 1e-2
        # more rows a token than GATHERED_ROWS_PER_TOKEN: the FP8 decode kernel, a row a token
        monkeypatch.setattr(attention, "GATHERED_ROWS_PER_TOKEN", sum(lengths) // batch.num_tokens - 1)
        calls.clear()
        KernelDsaBackend().sparse_mla(qa, cache.mla, 0, batch, topk, 0.05)
        assert calls == [("sparse_mla_decode", torch.uint8, cache.mla.buffer.shape[1])]


def test_the_gather_needs_enough_query_heads_few_rows_a_token_and_flashmla(monkeypatch):
    import types

    import dsa_kernels
    from dsa_backend import attention

    monkeypatch.setattr(dsa_kernels, "sparse_mla_prefill_on_flashmla", lambda q, topk: topk == 2048)

    def gathers(tokens, heads, rows, topk=2048):
        batch = types.SimpleNamespace(num_tokens=tokens, seq_lens_cpu=[rows])
        return attention.gathers_fp8_rows(batch, torch.empty(tokens, heads, 576, device="meta"), topk)

    assert gathers(128, 128, 128) and not gathers(127, 128, 127)  # 128 x 128 query heads
    assert gathers(256, 64, 256) and not gathers(255, 64, 255)
    assert gathers(512, 128, 256 * 512) and not gathers(512, 128, 256 * 512 + 1)  # rows a token
    assert not gathers(8192, 128, (1 << 30) // 1152 + 1)  # the gathered rows' bytes
    assert not gathers(512, 128, 512, topk=2000)  # FlashMLA's prefill does not take it


def test_reference_topk_is_the_top_of_the_scores(config):
    # score[t, s] = sum_h w relu(scale q.k): recomputed densely from the exact pool.
    lengths = [11]
    cache, pages = _filled_cache(config, "auto", lengths)
    layer = next(iter(cache.indexer.index_of_layer))
    batch = ForwardBatch.build(ForwardMode.DECODE, [[1]], [10], pages, PAGE)
    q, w = torch.randn(1, HEADS, 128), torch.rand(1, HEADS)
    keys = cache.indexer.load(layer, batch.slots(0, torch.arange(11))).float()
    scores = (torch.relu(0.1 * torch.einsum("hd,sd->hs", q[0], keys)) * w[0, :, None]).sum(0)
    got = TorchDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1)
    assert set(got[0].tolist()) == set(scores.topk(TOPK).indices.tolist())


# root 0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}; 3 -> {6}; 5 -> {7, 8}
TREE = TreeLayout(((0,), (0, 1), (0, 2), (0, 1, 3), (0, 1, 4), (0, 2, 5), (0, 1, 3, 6), (0, 2, 5, 7), (0, 2, 5, 8)))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "auto"])
@pytest.mark.parametrize("prefix", [3, 20])  # every key in the top-k (dense), or a real selection
def test_tree_topk_is_the_causal_topk_of_each_nodes_path(config, kv_cache_dtype, prefix):
    # Node i of a tree based at `prefix` has its own slot prefix + i; its top-k must be what a
    # plain causal pass over the sequence it stands for (prefix, then its ancestors) selects.
    cache, pages = _filled_cache(config, kv_cache_dtype, [prefix + 9])
    layer = next(iter(cache.indexer.index_of_layer))
    batch = ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[1] * 9], [prefix], pages, PAGE, trees=[TREE])
    assert batch.positions.tolist() == [prefix + len(a) - 1 for a in TREE.ancestors]
    gen = torch.Generator().manual_seed(2)
    q, w = torch.randn(9, HEADS, 128, generator=gen), torch.randn(9, HEADS, generator=gen)
    got = TorchDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1)
    assert torch.equal(KernelDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1), got)
    for node, path in enumerate(TREE.ancestors):
        chain_pages = [cache.allocator.allocate(pages_needed(prefix + len(path), PAGE))]
        chain = ForwardBatch.build(ForwardMode.DECODE, [[1]], [prefix + len(path) - 1], chain_pages, PAGE)
        src = torch.tensor(list(range(prefix)) + [prefix + a for a in path])
        cache.move_kv_cache(chain.slots(0, torch.arange(len(src))), batch.slots(0, src))
        want = TorchDsaBackend().indexer_topk(q[node:node + 1], w[node:node + 1], cache.indexer, layer, chain,
                                              TOPK, 0.1)[0]
        as_tree = torch.where(want >= prefix, src[want.long().clamp_min(0)], want)  # chain position -> tree slot
        assert torch.equal(got[node], as_tree.int()), node
        cache.allocator.free(chain_pages[0])


SMALL_TREE = TreeLayout(((0,), (0, 1), (0, 2)))


def test_requests_with_equal_token_counts_share_one_page_walk():
    pages = [[3, 1, 4], [0, 2, 5]]  # 12 slots a request
    cases = [  # (mode, tokens per request, trees) -> the shared walk's next_n, None: a walk a token
        (ForwardMode.DECODE, [1, 1], None, 1),
        (ForwardMode.TARGET_VERIFY, [3, 3], None, 3),
        (ForwardMode.TARGET_VERIFY, [9, 9], [TREE, TREE], 9),
        (ForwardMode.DRAFT_EXTEND, [1, 3], None, None),
        (ForwardMode.TARGET_VERIFY, [9, 3], [TREE, SMALL_TREE], None),
    ]
    for mode, counts, trees, want in cases:
        batch = ForwardBatch.build(mode, [[1] * n for n in counts], [2, 2], pages, PAGE, trees=trees)
        assert shared_page_walk(batch) == want, (mode, counts)
        # the launch shapes come from the host copies, which must say what the GPU's lengths say
        assert batch.seq_lens_cpu == batch.seq_lens.tolist() and batch.extend_lens_cpu == batch.extend_lens.tolist()
        assert batch.max_seq_len == int(batch.seq_lens.max())


# Equal trees share one page walk; a smaller tree, or a plain token beside the tree, walk a token.
@pytest.mark.parametrize("second_tree", [TREE, SMALL_TREE, None])
def test_tree_topk_of_two_requests_equals_the_reference(config, second_tree):
    sizes = [9, len(second_tree.ancestors) if second_tree else 1]
    cache, pages = _filled_cache(config, "fp8", [20 + sizes[0], 14 + sizes[1]])
    layer = next(iter(cache.indexer.index_of_layer))
    batch = ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[1] * n for n in sizes], [20, 14], pages, PAGE,
                               trees=[TREE, second_tree])
    gen = torch.Generator().manual_seed(3)
    q, w = torch.randn(sum(sizes), HEADS, 128, generator=gen), torch.randn(sum(sizes), HEADS, generator=gen)
    want = TorchDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1)
    assert torch.equal(KernelDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1), want)


def test_ragged_pieces_cover_every_row_once_within_the_logits_budget():
    cases = [  # (extend_lens, seq_lens, max_logits)
        ([5, 1, 1, 7], [5, 30, 40, 20], 10_000),   # one call, as before the pieces
        ([5, 1, 1, 7], [5, 30, 40, 20], 100),      # runs of whole requests
        ([40, 1, 3], [40, 90, 50], 300),           # the first request alone does not fit: slices of its rows
        ([1] * 6, [30] * 6, 30),                   # one decode token a call
    ]
    for extend_lens, seq_lens, max_logits in cases:
        pieces = ragged_pieces(extend_lens, seq_lens, max_logits)
        assert [p.rows.start for p in pieces] == [0] + [p.rows.stop for p in pieces[:-1]]
        assert pieces[-1].rows.stop == sum(extend_lens)
        ends = [sum(extend_lens[: r + 1]) for r in range(len(extend_lens))]
        for p in pieces:
            assert (p.rows.stop - p.rows.start) * sum(p.key_lens) <= max_logits, (extend_lens, p)
            assert len(p.key_lens) == p.requests.stop - p.requests.start
            for i, r in enumerate(range(p.requests.start, p.requests.stop)):  # the last row's position + 1
                last_row = min(ends[r], p.rows.stop) - 1
                assert p.key_lens[i] == seq_lens[r] - (ends[r] - 1 - last_row)
    assert len(ragged_pieces([5, 1, 1, 7], [5, 30, 40, 20], 10_000)) == 1
    assert [p.requests for p in ragged_pieces([40, 1, 3], [40, 90, 50], 300)][-2:] == [slice(1, 2), slice(2, 3)]


def test_a_prefill_chunk_among_long_decodes_is_ranked_in_pieces(config, monkeypatch):
    """An EXTEND batch of two prefill chunks and decode tokens of longer requests: the kernel
    backend's ragged calls stay within its logits budget and rank as the reference does."""
    import dsa_kernels

    lengths, new = [30, 41, 26, 37, 12], [1, 1, 9, 1, 12]
    cache, pages = _filled_cache(config, "fp8", lengths)
    layer = next(iter(cache.indexer.index_of_layer))
    batch = ForwardBatch.build(ForwardMode.EXTEND, [[1] * n for n in new], [s - n for s, n in zip(lengths, new)],
                               pages, PAGE)
    gen = torch.Generator().manual_seed(5)
    q, w = torch.randn(batch.num_tokens, HEADS, 128, generator=gen), torch.randn(batch.num_tokens, HEADS, generator=gen)
    want = TorchDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1)
    sizes, ragged = [], dsa_kernels.ragged_indexer_logits
    monkeypatch.setattr(dsa_kernels, "ragged_indexer_logits",
                        lambda q, *a, **k: sizes.append(q.shape[0] * a[1].shape[0]) or ragged(q, *a, **k))
    bounds, topk = [], dsa_kernels.topk_transform
    monkeypatch.setattr(dsa_kernels, "topk_transform", lambda logits, lens, *a, **k: bounds.append(
        (logits.shape[1], int(lens.max()), k["max_length"])) or topk(logits, lens, *a, **k))
    budget = 120  # logits a call: the 9- and 12-token chunks go in slices of their rows
    got = KernelDsaBackend(extend_logits_bytes=4 * budget).indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1)
    assert torch.equal(got, want)
    assert len(sizes) > 3 and max(sizes) <= budget, sizes
    calls = len(sizes)
    assert torch.equal(KernelDsaBackend().indexer_topk(q, w, cache.indexer, layer, batch, TOPK, 0.1), want)
    assert sizes[calls:] == [batch.num_tokens * sum(lengths)]  # the default budget: one call, as before
    # the top-k's launch is sized by the longest request of a piece, not by the piece's logits,
    # which hold every request's keys side by side
    assert all(longest_row <= bound <= width for width, longest_row, bound in bounds), bounds
    assert bounds[-1] == (sum(lengths), max(lengths), max(lengths))


def test_backend_is_chosen_by_device():
    assert isinstance(default_backend("cpu"), TorchDsaBackend)


# ---------------------------------------------------------------- GPU: kernels vs reference

gpu = pytest.mark.gpu
# A random bf16 model amplifies every rounding difference layer by layer (the 4-layer tiny model
# moved its last logits by 5% (exact pool) to 58% (FP8 pool, top-k of deeper layers flipping) of
# their largest magnitude, H200 2026-11-22), so the comparison runs on one DSA layer, whose input
# is identical under both backends. Tolerances: top-k sets of that layer agree on >= 97% of
# positions (the fp8 MMA accumulates with reduced precision and may swap near-tied keys; 100%
# measured on the H200 for prefill); logits within 2% of their largest magnitude (sparse MLA in
# bf16 MMAs vs float32: ~2e-3 relative, docs/PERFORMANCE.md); greedy continuations share >= 60% of
# their tokens as a common prefix (bf16 argmax near-ties flip a continuation for good).
TOPK_OVERLAP = 0.97
LOGITS_RTOL = 0.02
GREEDY_PREFIX = 0.6


@pytest.fixture(scope="module")
def one_layer_checkpoint(tmp_path_factory):
    from dsa_backend.tools.make_checkpoint import write_checkpoint

    cfg = make_config("deepseek_v32", "tiny")
    cfg["num_hidden_layers"] = 1
    path = tmp_path_factory.mktemp("one_layer") / "ckpt"
    write_checkpoint(cfg, path, seed=1)
    return path


def _prefill_then_decode(model, cache_dtype, prompts, next_tokens, backend):
    """Layer 0's top-k of each forward and the logits of a prefill and one decode step."""
    cache = KVCache(model.config, 16, 64, dtype=torch.bfloat16, kv_cache_dtype=cache_dtype, device="cuda")
    pages = [cache.allocator.allocate(pages_needed(len(p) + 1, 64)) for p in prompts]
    captured = []
    handle = model.model.layers[0].self_attn.indexer.register_forward_hook(lambda m, i, o: captured.append(o))
    model.backend = backend
    try:
        batch = ForwardBatch.build(ForwardMode.EXTEND, prompts, [0] * len(prompts), pages, 64, "cuda")
        out = model(batch, cache)
        step = ForwardBatch.build(ForwardMode.DECODE, [[t] for t in next_tokens], [len(p) for p in prompts],
                                  pages, 64, "cuda")
        decoded = model(step, cache)
    finally:
        handle.remove()
        model.backend = None
    return captured, out.logits.float(), decoded.logits.float()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    hits = total = 0
    for x, y in zip(a.tolist(), b.tolist()):
        sx, sy = {i for i in x if i >= 0}, {i for i in y if i >= 0}
        hits += len(sx & sy)
        total += max(len(sy), 1)
    return hits / total


@gpu
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "auto"])
def test_model_with_kernel_backend_matches_the_reference_on_cuda(one_layer_checkpoint, kv_cache_dtype):
    from dsa_backend.models import load_model

    model, _ = load_model(one_layer_checkpoint, torch.bfloat16, "cuda")
    prompts = random_prompts((20, 45, 70, 100), seed=5)
    next_tokens = [5, 6, 7, 8]  # the same decode input under both backends
    ref_topk, ref_logits, ref_decode = _prefill_then_decode(model, kv_cache_dtype, prompts, next_tokens,
                                                            TorchDsaBackend())
    topk, logits, decode = _prefill_then_decode(model, kv_cache_dtype, prompts, next_tokens, KernelDsaBackend())
    overlap = [_overlap(a, b) for a, b in zip(topk, ref_topk)]  # prefill, then decode
    rel = [float((x - y).abs().max() / y.abs().max()) for x, y in ((logits, ref_logits), (decode, ref_decode))]
    print(f"\n[{kv_cache_dtype}] top-k overlap prefill/decode {overlap}, logits max diff / max |logit| "
          f"prefill/decode {rel}, argmax agree {(logits.argmax(-1) == ref_logits.argmax(-1)).float().mean():.2f}")
    assert min(overlap) >= TOPK_OVERLAP
    assert max(rel) <= LOGITS_RTOL


@gpu
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "auto"])
def test_engine_greedy_outputs_agree_across_backends_on_cuda(one_layer_checkpoint, kv_cache_dtype):
    from dsa_backend.engine import Engine, EngineArgs
    from dsa_backend.sampling_params import SamplingParams

    prompts = random_prompts((20, 45, 70, 100, 130, 33), seed=7)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    results = {}
    engine = Engine(EngineArgs(model=str(one_layer_checkpoint), device="cuda", dtype="bfloat16",
                               kv_cache_dtype=kv_cache_dtype, num_kv_pages=64, page_size=64))
    for name, backend in (("torch", TorchDsaBackend()), ("kernel", KernelDsaBackend())):
        engine.model.backend = backend
        outs: dict[str, list[int]] = {f"{name}-{i}": [] for i in range(len(prompts))}
        for i, p in enumerate(prompts):
            engine.add_request(f"{name}-{i}", p, params)
        finished = 0
        while finished < len(prompts):
            for o in engine.step():
                outs[o.request_id].extend(o.new_token_ids)
                finished += o.finished
        results[name] = [outs[f"{name}-{i}"] for i in range(len(prompts))]
    # Greedy runs diverge for good after the first flipped argmax; count the common prefix.
    same = sum(next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
               for x, y in zip(results["kernel"], results["torch"]))
    total = sum(len(x) for x in results["torch"])
    print(f"\n[{kv_cache_dtype}] greedy tokens in the common prefix: {same}/{total}")
    assert same >= GREEDY_PREFIX * total


@gpu
def test_an_fp8_prefill_gathered_for_flashmla_matches_the_reference_on_cuda(tmp_path, monkeypatch):
    import dsa_kernels
    from dsa_backend import attention
    from dsa_backend.models import load_model
    from dsa_backend.tools.make_checkpoint import write_checkpoint

    if not dsa_kernels.available_backends("cuda")["flashmla"]:
        pytest.skip("FlashMLA not installed")
    cfg = make_config("deepseek_v32", "tiny")
    cfg.update(num_hidden_layers=1, index_topk=128)  # a top-k FlashMLA's prefill takes
    write_checkpoint(cfg, tmp_path / "ckpt", seed=2)
    model, _ = load_model(tmp_path / "ckpt", torch.bfloat16, "cuda")
    monkeypatch.setattr(attention, "MIN_GATHERED_HEAD_ROWS", 1)
    calls = _recorded_mla_calls(monkeypatch)
    prompts = random_prompts((150, 300), seed=6)
    ref_topk, ref_logits, ref_decode = _prefill_then_decode(model, "fp8", prompts, [5, 6], TorchDsaBackend())
    topk, logits, decode = _prefill_then_decode(model, "fp8", prompts, [5, 6], KernelDsaBackend())
    assert calls[0] == ("sparse_mla_prefill", torch.bfloat16, 450) and calls[1][:2] == ("sparse_mla_decode", torch.uint8)
    assert min(_overlap(a, b) for a, b in zip(topk, ref_topk)) >= TOPK_OVERLAP
    rel = [float((x - y).abs().max() / y.abs().max()) for x, y in ((logits, ref_logits), (decode, ref_decode))]
    assert max(rel) <= LOGITS_RTOL, rel


@gpu
def test_kernel_backend_on_a_gpu_without_e4m3_kernels_matches_the_reference(one_layer_checkpoint, monkeypatch):
    """As on an A100 (8.0), where Triton compiles no e4m3: the indexer logits and the FP8-pool
    sparse MLA run on the references, on the GPU (no e4m3 kernel of ours may run), the top-k on ours."""
    from dsa_backend.models import load_model
    from dsa_kernels import dispatch, indexer_logits, sparse_mla

    def e4m3_kernel(*args, **kwargs):
        raise AssertionError("an e4m3 kernel of ours ran")

    monkeypatch.setattr(dispatch, "capability", lambda device: (8, 0))
    for module, name in ((indexer_logits, "paged_indexer_logits"), (indexer_logits, "ragged_indexer_logits"),
                         (sparse_mla, "sparse_mla")):
        monkeypatch.setattr(module, name, e4m3_kernel)
    model, _ = load_model(one_layer_checkpoint, torch.bfloat16, "cuda")
    prompts = random_prompts((20, 45, 70, 100), seed=5)
    ref_topk, ref_logits, ref_decode = _prefill_then_decode(model, "fp8", prompts, [5, 6, 7, 8], TorchDsaBackend())
    topk, logits, decode = _prefill_then_decode(model, "fp8", prompts, [5, 6, 7, 8], KernelDsaBackend())
    assert min(_overlap(a, b) for a, b in zip(topk, ref_topk)) >= TOPK_OVERLAP
    assert max(float((x - y).abs().max() / y.abs().max())
               for x, y in ((logits, ref_logits), (decode, ref_decode))) <= LOGITS_RTOL

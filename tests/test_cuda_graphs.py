"""CUDA graphs for decode steps (dsa_backend/cuda_graphs.py): buckets on the CPU, replays on the GPU."""

import pytest
import torch

from dsa_backend import LLM, SamplingParams
from dsa_backend.attention import TorchDsaBackend
from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cuda_graphs import MIN_CONTEXT_BUCKET, DecodeGraphs, batch_buckets, context_buckets
from dsa_backend.engine import Engine, EngineArgs


@pytest.mark.parametrize("max_batch", [1, 3, 8, 13, 64, 100])
def test_every_batch_size_pads_to_a_bucket_by_at_most_seven_rows_or_less_than_itself(max_batch):
    buckets = batch_buckets(max_batch)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_batch
    for n in range(1, max_batch + 1):
        padded = next(b for b in buckets if b >= n)
        assert padded - n <= min(7, n - 1)


@pytest.mark.parametrize("max_context", [100, 1024, 4096, 5000, 163840])
def test_every_context_runs_in_a_launch_at_most_twice_as_long_past_the_smallest_bucket(max_context):
    buckets = context_buckets(max_context)
    assert buckets[-1] == max_context and buckets == sorted(set(buckets))
    for length in range(1, max_context + 1, 97):
        bucket = next(b for b in buckets if b >= length)
        assert bucket <= max(2 * length, MIN_CONTEXT_BUCKET, buckets[0])


PAGE, PAD_PAGE = 16, 31


@pytest.fixture(scope="module")
def cpu_model(checkpoint):
    """The tiny model and a cache on the CPU: everything of DecodeGraphs but its captures runs there."""
    from dsa_backend.cache import KVCache
    from dsa_backend.models import load_model

    model, info = load_model(checkpoint("deepseek_v32"), torch.float32)
    return model, KVCache(model.config, 32, PAGE, dtype=torch.float32, mtp_has_indexer=info.mtp_has_indexer)


def _graphs(cpu_model, n: int = 1) -> DecodeGraphs:
    # a table of 16 pages, 256 slots
    return DecodeGraphs(*cpu_model, max_batch=8, max_context=250, pad_page=PAD_PAGE, tokens_per_request=n)


def _batch(n: int, requests: int, prefix: int = 20, mode: ForwardMode | None = None, **kwargs) -> ForwardBatch:
    mode = mode or (ForwardMode.DECODE if n == 1 else ForwardMode.TARGET_VERIFY)
    return ForwardBatch.build(mode, [[7 + r] * n for r in range(requests)], [prefix + r for r in range(requests)],
                              [[2 * r, 2 * r + 1] for r in range(requests)], PAGE, all_logits=n > 1, **kwargs)


@pytest.mark.parametrize("n", [1, 3])
def test_a_batch_is_copied_in_and_the_requests_past_it_pad_the_held_page(cpu_model, n):
    static = _graphs(cpu_model, n).static
    static.fill(_batch(n, 5), 8)
    batch = _batch(n, 3)
    static.fill(batch, 4)  # bucket 4: one padding request, where a real one was before
    t = 3 * n
    for buffer, made in ((static.input_ids, batch.input_ids), (static.positions, batch.positions),
                         (static.out_cache_loc, batch.out_cache_loc), (static.logits_rows, batch.logits_rows)):
        assert torch.equal(buffer[: made.shape[0]], made)
    assert torch.equal(static.seq_lens[:3], batch.seq_lens)
    assert torch.equal(static.block_table[:3, :2], batch.block_table)
    pad = slice(t, t + n)
    assert torch.equal(static.input_ids[pad], torch.zeros(n, dtype=torch.long))
    assert torch.equal(static.positions[pad], torch.arange(n))
    assert torch.equal(static.out_cache_loc[pad], PAD_PAGE * PAGE + torch.arange(n))
    assert torch.equal(static.logits_rows[3 if n == 1 else pad], torch.tensor(3 if n == 1 else list(range(t, t + n))))
    assert static.seq_lens[3] == n and bool((static.block_table[3] == PAD_PAGE).all())


def test_graphs_serve_only_the_batches_their_captures_replay(cpu_model):
    from dsa_backend.attention import KernelDsaBackend
    from dsa_backend.batch import TreeLayout

    decode, verify = _graphs(cpu_model), _graphs(cpu_model, 3)
    assert decode.serves(_batch(1, 8)) and verify.serves(_batch(3, 8))
    assert not decode.serves(_batch(1, 9))                                   # past the largest batch bucket
    long = ForwardBatch.build(ForwardMode.DECODE, [[1]], [250], [list(range(16))], PAGE)
    assert not decode.serves(long)                                           # past the longest context
    assert not decode.serves(_batch(3, 2)) and not verify.serves(_batch(1, 2))  # the other mode
    assert not decode.serves(_batch(1, 2, mode=ForwardMode.EXTEND))
    assert not verify.serves(_batch(3, 2, trees=[TreeLayout(((0,), (0, 1), (0, 2)))] * 2))  # a draft tree
    uneven = ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[1, 2, 3], [4, 5]], [20, 30], [[0, 1], [2, 3]], PAGE,
                                all_logits=True)
    assert not verify.serves(uneven)
    wide = ForwardBatch.build(ForwardMode.DECODE, [[1]], [20], [list(range(17))], PAGE)  # 17 pages: drafts' reserve
    assert not decode.serves(wide)
    model = cpu_model[0]
    model.backend = KernelDsaBackend()
    try:
        assert not decode.serves(_batch(1, 2))                               # not the captured backend
    finally:
        model.backend = None


def _prefilled(engine: Engine, lengths: list[int]) -> list:
    """Requests of these prompt lengths, stepped until each has its first token (prefill done)."""
    g = torch.Generator().manual_seed(3)
    for i, n in enumerate(lengths):
        prompt = torch.randint(100, engine.config.vocab_size, (n,), generator=g).tolist()
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    seqs = list(engine.sequences.values())
    while any(not s.output_ids for s in seqs):
        engine.step()
    return seqs


def _decode_batch(engine: Engine, seqs) -> ForwardBatch:
    """The step the engine's graphs serve: each request's last output at its next position, and
    with a chain's verify graphs n - 1 draft tokens after it (on pages the drafter reserved)."""
    n = engine.graphs.n
    return ForwardBatch.build(engine.graphs.mode, [[s.output_ids[-1]] + list(range(500, 499 + n)) for s in seqs],
                              [s.num_computed for s in seqs], [s.pages for s in seqs], engine.args.page_size,
                              engine.device, all_logits=n > 1)


def _engine(checkpoint, arch: str, spec_steps: int) -> Engine:
    spec = dict(speculative_algorithm="mtp", speculative_num_steps=spec_steps) if spec_steps else {}
    return Engine(EngineArgs(str(checkpoint(arch)), device="cuda", page_size=16, num_kv_pages=256,
                             max_running_requests=8, **spec))


# Prompt lengths off page boundaries (the next token's slot is on a page already held); the
# longest puts its batch in the second context bucket.
LENGTHS = [5, 40, 70, 100, 3, 1100, 33, 9]


@pytest.mark.gpu
@pytest.mark.parametrize("arch,spec_steps", [("deepseek_v32", 0), ("glm_moe_dsa", 0), ("deepseek_v32", 2)])
def test_a_replayed_step_gives_the_eager_forwards_logits(checkpoint, arch, spec_steps):
    # spec_steps 2: a chain's verify, three tokens a request
    engine = _engine(checkpoint, arch, spec_steps)
    seqs = _prefilled(engine, LENGTHS)
    for rows in ([0], [0, 1, 2], [1, 2, 3, 4], [5, 0], list(range(8))):  # padded and full buckets, two contexts
        batch = _decode_batch(engine, [seqs[r] for r in rows])
        assert engine.graphs.serves(batch)
        eager = engine.model(batch, engine.cache).logits
        replayed = engine.graphs.forward(batch).logits
        assert replayed.shape == eager.shape
        assert torch.equal(replayed.argmax(-1), eager.argmax(-1))
        torch.testing.assert_close(replayed, eager, rtol=2e-2, atol=2e-2 * eager.abs().max().item())
    assert {context for _, context in engine.graphs.graphs} == {1024, 2048}
    engine.model.backend = TorchDsaBackend()  # not what the graphs captured: eager forwards
    assert not engine.graphs.serves(batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec_steps", [0, 2])
def test_padding_rows_write_only_the_held_page(checkpoint, spec_steps):
    engine = _engine(checkpoint, "deepseek_v32", spec_steps)
    seqs = _prefilled(engine, LENGTHS)
    batch = _decode_batch(engine, seqs[:3])  # bucket 4: one padding row
    mla, index = engine.cache.mla.buffer.clone(), engine.cache.indexer.buffer.clone()
    engine.graphs.forward(batch)
    torch.cuda.synchronize()
    page_size, pad = engine.args.page_size, engine.graphs.pad_page
    written = set(batch.out_cache_loc.tolist()) | set(range(pad * page_size, (pad + 1) * page_size))
    changed = (engine.cache.mla.buffer != mla).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    assert changed and set(changed) <= written and set(changed) & set(range(pad * page_size, (pad + 1) * page_size))
    pages = (engine.cache.indexer.buffer != index).any(-1).any(0).nonzero().flatten().tolist()
    assert set(pages) <= {s // page_size for s in written}


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_greedy_tokens_with_graphs_equal_the_eager_engines(checkpoint, arch, monkeypatch):
    # Four requests decode together, then the last two: every decode batch fills its bucket, so the
    # graphs launch the eager steps' kernels at the eager steps' shapes (but for the context bucket).
    args = dict(device="cuda", page_size=16, num_kv_pages=512, max_running_requests=4, max_model_len=2048)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(100, 129280, (n,), generator=g).tolist() for n in (7, 60, 300, 1000, 21, 2)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    eager = [out.token_ids for out in LLM(checkpoint(arch), cuda_graph=False, **args).generate(prompts, params)]
    llm = LLM(checkpoint(arch), **args)
    llm.engine.graphs.capture_all()
    captured = set(llm.engine.graphs.graphs)
    assert captured == {(b, c) for b in (1, 2, 4) for c in (1024, 2048)}
    replayed = []
    forward = llm.engine.graphs.forward
    monkeypatch.setattr(llm.engine.graphs, "forward", lambda batch: replayed.append(batch.batch_size) or forward(batch))
    assert [out.token_ids for out in llm.generate(prompts, params)] == eager
    assert len(replayed) >= 39 and set(llm.engine.graphs.graphs) == captured  # decode steps replayed, none captured
    assert llm.engine.scheduler.pages.num_available == llm.engine.num_kv_pages  # all but the held page free again


@pytest.mark.gpu
@pytest.mark.parametrize("engine_args", [dict(dtype="float32"), dict(cuda_graph=False),
                                         dict(speculative_algorithm="eagle", speculative_num_steps=2,
                                              speculative_eagle_topk=2)])
def test_graphs_are_off_where_a_capture_cannot_serve_or_the_user_says_so(checkpoint, engine_args):
    # float32's grouped GEMM reads its group sizes back to the host (batch_invariant's too, but it
    # patches the whole process: tests/test_batch_invariance.py); tree verify steps run eagerly
    engine = Engine(EngineArgs(str(checkpoint("deepseek_v32")), device="cuda", num_kv_pages=64, **engine_args))
    assert engine.graphs is None and engine.num_held_pages == 0


@pytest.mark.gpu
def test_greedy_tokens_of_a_chain_with_verify_graphs_equal_the_eager_engines(checkpoint, monkeypatch):
    # Two requests at most: every verify batch (2 or 1 requests) fills its bucket.
    args = dict(device="cuda", page_size=16, num_kv_pages=256, max_running_requests=2, max_model_len=2048,
                speculative_algorithm="mtp", speculative_num_steps=2)
    prompts = [list(range(300, 340)), list(range(1000, 1900, 3))]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    eager_llm = LLM(checkpoint("deepseek_v32"), cuda_graph=False, **args)
    eager = [out.token_ids for out in eager_llm.generate(prompts, params)]
    llm = LLM(checkpoint("deepseek_v32"), **args)
    assert llm.engine.graphs.mode is ForwardMode.TARGET_VERIFY and llm.engine.graphs.n == 3
    replayed = []
    forward = llm.engine.graphs.forward
    monkeypatch.setattr(llm.engine.graphs, "forward", lambda batch: replayed.append(batch.batch_size) or forward(batch))
    assert [out.token_ids for out in llm.generate(prompts, params)] == eager
    assert len(replayed) >= 10

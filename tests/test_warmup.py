"""Start-up warm-up (dsa_backend/warmup.py): its ladders reach every kernel config the host rules
give a step shape, and its sweep runs every shape through the kernel backend and gives its pages back.

The compiles themselves are checked on the GPU (tests/kernels/test_specialization.py's warm-up test)."""

from __future__ import annotations

import random

import pytest
import torch

from dsa_backend import warmup
from dsa_backend.attention import EXTEND_LOGITS_BYTES, KernelDsaBackend
from dsa_backend.cache import KVCache
from dsa_backend.config import ModelConfig
from dsa_backend.models import load_model
from dsa_backend.models.fp8_linear import Fp8Linear
from dsa_backend.tools.make_checkpoint import make_config
from dsa_kernels import fp8_gemm
from dsa_kernels.indexer_gluon import gluon_config
from dsa_kernels.topk import launch_choice

SMS, LONGEST, RUNNING, TOKENS = 132, 163840, 64, 2048  # an H100 serving DeepSeek-V3.2 at the defaults


def topk_launch(rows: int, width: int) -> tuple:
    """What the top-k compiles for logits [rows, width] (kernels/topk.py's choice)."""
    return launch_choice(rows, width, 2048, SMS)


def decode_configs(batch: int, contexts, next_n: int) -> set:
    """The configs the paged indexer (Gluon, Hopper) and the top-k compile, each on its own."""
    indexer = {tuple(sorted(gluon_config(batch, c, next_n, SMS).items())) for c in contexts}
    return indexer | {topk_launch(batch * next_n, c) for c in contexts}


@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_the_context_ladder_reaches_every_decode_config(next_n):
    # Every config is constant between page boundaries (chunks, spans and thresholds are multiples
    # of 64 keys), so the pages are every context there is.
    every_page = range(64, LONGEST + 1, 64)
    ladder = [max(c, next_n) for c in warmup.context_ladder(LONGEST, 64)]
    for batch in range(1, RUNNING + 1):
        assert decode_configs(batch, every_page, next_n) == decode_configs(batch, ladder, next_n), batch


def test_the_prefill_ladders_reach_every_topk_config():
    # A piece's top-k launch follows its rows and its longest request's keys (the top-k's
    # max_length), not its logits' width (every request's keys side by side).
    shapes = warmup.WarmupShapes(RUNNING, TOKENS, LONGEST)
    swept = {topk_launch(requests * tokens, keys)
             for _, requests, tokens, keys, _ in warmup.warmup_calls(shapes, LONGEST, 64)["prefill"]}
    rng = random.Random(0)
    for _ in range(20000):
        tokens = rng.randint(1, TOKENS)
        # the longest of at most RUNNING requests that hold the rows, within the logits budget
        keys = rng.randint(-(-tokens // RUNNING), min(LONGEST, EXTEND_LOGITS_BYTES // 4 // tokens))
        assert topk_launch(tokens, keys) in swept, (tokens, keys)


def test_ladders_are_dense_then_geometric_with_every_power_of_two():
    steps = warmup.ladder(5000, 64, 2048, 1 / 8)
    assert steps[:3] == [64, 128, 192] and steps[-1] == 5000 and 4096 in steps
    assert all(b <= a * (1 + 1 / 8) + 64 for a, b in zip(steps, steps[1:]))
    assert warmup.context_ladder(200, 64) == [63, 64, 127, 128, 191, 192, 199, 200]


class CountingBackend(KernelDsaBackend):
    """The kernel backend (on the CPU: dsa_kernels' references), counting the calls by mode and rows."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def indexer_topk(self, q, weights, pool, layer, batch, topk, softmax_scale):
        out = super().indexer_topk(q, weights, pool, layer, batch, topk, softmax_scale)
        assert out.shape == (batch.num_tokens, topk)
        self.calls.append(("indexer", batch.mode.name, batch.batch_size, batch.num_tokens, int(batch.seq_lens.max())))
        return out

    def sparse_mla(self, q, pool, layer, batch, topk_positions, softmax_scale):
        out = super().sparse_mla(q, pool, layer, batch, topk_positions, softmax_scale)
        self.calls.append(("mla", batch.mode.name, batch.num_tokens))
        return out


def test_warm_up_runs_every_step_shape_and_gives_its_pages_back(monkeypatch):
    config = ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))
    cache = KVCache(config, 40, 16, dtype=torch.float32, kv_cache_dtype="fp8")
    backend = CountingBackend()
    monkeypatch.setattr(warmup, "default_backend", lambda device: backend)  # the kernel backend on the CPU too
    shapes = warmup.WarmupShapes(max_running_requests=3, max_num_batched_tokens=8, max_context_len=100,
                                 tokens_per_verify=2)
    calls = warmup.warm_up(cache, config, shapes)
    assert calls == len(backend.calls) and cache.allocator.num_free == 40
    contexts = warmup.context_ladder(100, 16)
    decode = {c[2:] for c in backend.calls if c[:2] == ("indexer", "DECODE")}
    assert decode == {(b, b, c) for b in range(1, 7) for c in contexts}  # decode_rows: 3 requests x 2 tokens
    verify = {c[2:] for c in backend.calls if c[:2] == ("indexer", "TARGET_VERIFY")}
    assert verify == {(b, 2 * b, max(c, 2)) for b in range(1, 4) for c in contexts}
    assert {c[2] for c in backend.calls if c[:2] == ("mla", "DECODE")} == set(range(1, 7))
    assert {c[2] for c in backend.calls if c[:2] == ("mla", "EXTEND")} == set(range(1, 9))
    prefill = [c for c in backend.calls if c[:2] == ("indexer", "EXTEND")]
    assert {c[3] for c in prefill} == set(range(1, 9)) and max(c[4] for c in prefill) == 100


def test_where_a_prefill_step_gathers_the_warm_up_runs_the_fp8_decode_kernel_too(monkeypatch):
    import collections

    import dsa_kernels

    config = ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))
    cache = KVCache(config, 40, 16, dtype=torch.bfloat16, kv_cache_dtype="fp8")  # bf16 q: the kernels' path
    monkeypatch.setattr(warmup, "default_backend", lambda device: CountingBackend())
    # the warm-up's view: EXTEND steps of 4 rows and more gather (the backend itself, on the CPU, does not)
    monkeypatch.setattr(warmup, "gathers_fp8_rows", lambda batch, q, topk: batch.num_tokens >= 4)
    rows = collections.Counter()
    decode = dsa_kernels.sparse_mla_decode
    monkeypatch.setattr(dsa_kernels, "sparse_mla_decode", lambda q, kv, idx, scale: rows.update([q.shape[0]]) or
                        decode(q, kv, idx, scale))
    warmup.warm_up(cache, config, warmup.WarmupShapes(max_running_requests=3, max_num_batched_tokens=8,
                                                      max_context_len=100, tokens_per_verify=2))
    # decode rows 1-6 and EXTEND rows 1-8 through the backend, and once more at the gathering rows
    assert rows == {1: 2, 2: 2, 3: 2, 4: 3, 5: 3, 6: 3, 7: 2, 8: 2}


def test_warm_up_compiles_nothing_on_the_cpu():
    config = ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))
    cache = KVCache(config, 8, 16, dtype=torch.float32)
    assert warmup.warm_up(cache, config, warmup.WarmupShapes(4, 64, 128)) == 0


def test_the_engine_warms_up_at_its_own_limits_when_asked(checkpoint, monkeypatch):
    from dsa_backend import engine as engine_module

    seen = []
    monkeypatch.setattr(engine_module, "warm_up", lambda cache, config, shapes, threads: seen.append((shapes, threads)))
    args = dict(model=str(checkpoint("deepseek_v32")), device="cpu", dtype="float32", page_size=16,
                max_running_requests=5, max_num_batched_tokens=96, max_model_len=300)
    engine_module.Engine(engine_module.EngineArgs(**args))
    assert seen == []  # off by default
    engine_module.Engine(engine_module.EngineArgs(**args, warmup=True, speculative_algorithm="mtp",
                                                  speculative_num_steps=3))
    assert seen == [(warmup.WarmupShapes(5, 96, 300, tokens_per_verify=4, draft_rows=1), warmup.default_threads())]
    seen.clear()
    engine_module.Engine(engine_module.EngineArgs(**args, warmup=True, num_kv_pages=10, warmup_threads=0))
    assert seen == [(warmup.WarmupShapes(5, 96, 160), 0)]  # no context past what the pools hold
    with pytest.raises(ValueError, match="warmup_threads must be 0 or more, got -1"):
        engine_module.Engine(engine_module.EngineArgs(**args, warmup=True, warmup_threads=-1))
    assert 1 <= warmup.default_threads() <= 16


def test_the_warm_up_calls_the_backend_with_kernel_launches_compiling_only(monkeypatch):
    import dsa_kernels

    config = ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))
    cache = KVCache(config, 40, 16, dtype=torch.float32, kv_cache_dtype="fp8")
    inside, blocks = [], []
    backend = CountingBackend()
    monkeypatch.setattr(warmup, "default_backend", lambda device: backend)
    real = dsa_kernels.compile_only

    def watched(threads):
        blocks.append(threads)
        return real(threads)

    monkeypatch.setattr(dsa_kernels, "compile_only", watched)
    count = backend.indexer_topk
    monkeypatch.setattr(backend, "indexer_topk", lambda *a: inside.append(_compiling_only()) or count(*a))
    warmup.warm_up(cache, config, warmup.WarmupShapes(2, 8, 64), threads=3)
    assert blocks == [3] and inside and all(inside)
    assert not _compiling_only()


def _compiling_only() -> bool:
    from dsa_kernels.compile_only import compiling_only

    return compiling_only()


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [4, 0])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_after_the_warm_up_no_step_compiles_a_kernel(monkeypatch, kv_cache_dtype, threads):
    """DeepSeek-V3.2's DSA shapes (64 indexer heads, 128 heads, top-k 2048) within small limits:
    after warm_up, random decode, verify and mixed prefill steps (contexts up to the longest, off
    the page boundaries) run the kernel backend without one Triton compile."""
    import triton

    from dsa_backend.attention import default_backend
    from dsa_backend.batch import ForwardBatch, ForwardMode
    from dsa_backend.cache import pages_needed

    config = ModelConfig.from_dict(make_config("deepseek_v32", "v32-slice"))
    running, budget, longest = 8, 256, 16384
    cache = KVCache(config, running * pages_needed(longest, 64) + 8, 64, dtype=torch.bfloat16,
                    kv_cache_dtype=kv_cache_dtype, device="cuda")
    shapes = warmup.WarmupShapes(running, budget, longest, tokens_per_verify=2)
    assert warmup.warm_up(cache, config, shapes, threads) > 0
    compiled = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", lambda **kw: compiled.append(kw["fn"].name))
    backend, rng = default_backend("cuda"), random.Random(0)
    for step in range(48):
        mode = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND)[step % 3]
        requests = rng.randint(1, running)
        if mode is ForwardMode.EXTEND:  # decode tokens and chunks within the token budget
            new = [rng.choice([1, rng.randint(2, budget // requests)]) for _ in range(requests)]
        else:
            new = [1 if mode is ForwardMode.DECODE else 2] * requests
        lengths = [rng.randint(n + 1, longest) for n in new]
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
        assert compiled == [], (step, mode.name, new, lengths)
    torch.cuda.synchronize()


def test_fp8_rows_reach_every_launch_config_of_our_gemm():
    cpu = torch.device("cpu")  # 4 "SMs": splits change with the rows as on a GPU
    for n, k in ((1536, 7168), (576, 7168), (24576, 1536)):
        rows = warmup.fp8_linear_rows(n, k, 600, cpu)
        every = {fp8_gemm.launch_config(m, n, k, cpu) for m in range(1, 601)}
        assert {fp8_gemm.launch_config(m, n, k, cpu) for m in rows} == every
        assert set(warmup.prefill_ladder(600)) <= set(rows)  # DeepGEMM's choices follow the rows too


def test_fp8_warm_up_runs_each_weight_shape_over_its_rows_and_the_experts_over_each_tile(checkpoint, monkeypatch):
    import dsa_kernels

    model, _ = load_model(checkpoint("deepseek_v32_fp8"), torch.float32, keep_fp8=True)
    dense, grouped = [], []
    linear, grouped_linear = dsa_kernels.fp8_linear, dsa_kernels.fp8_grouped_linear
    monkeypatch.setattr(dsa_kernels, "fp8_linear", lambda x, w, s: dense.append(((tuple(w.shape), tuple(s.shape)),
                                                                                  x.shape[0])) or linear(x, w, s))
    monkeypatch.setattr(dsa_kernels, "fp8_grouped_linear", lambda a, s, w, ws, ends, dtype, align: grouped.append(
        fp8_gemm.grouped_tiles(a.shape[0], w.shape[0])) or grouped_linear(a, s, w, ws, ends, dtype, align))
    calls = warmup.warm_up_fp8_gemms(model, max_rows=40, experts_per_token=2)
    # a weight shape with block scales and with per-row ones (a stack whose parts end off a block)
    # compiles apart
    shapes = {(tuple(m.weight.shape), tuple(m.weight_scale_inv.shape)) for m in model.modules()
              if isinstance(m, Fp8Linear)}
    assert {shape for shape, _ in dense} == shapes
    for (n, k), scales in shapes:
        assert sorted(m for shape, m in dense if shape == ((n, k), scales)) == \
            warmup.fp8_linear_rows(n, k, 40, torch.device("cpu"))
    # 8 experts, 2 a token: mean runs of 1..10 pairs at 40 tokens, all in the 16-row tile; w13 then w2
    assert set(grouped) == {fp8_gemm.grouped_tiles(p, 8) for p in range(2, 81, 2)}
    assert calls == len(dense) + len(grouped) // 2

"""Paged (native next_n) and ragged indexer logits match the float32 reference."""

import logging
from types import SimpleNamespace

import pytest
import torch
from triton.compiler.errors import CompilationError

from dsa_kernels import cache_store, gluon_compat, indexer_gluon, indexer_logits, reference

PAGE, HEADS = 16, 8
SMALL_TILES = dict(BLOCK_K=16, KEYS_PER_PROG=32, num_warps=4, num_stages=1)


def _paged_inputs(seq_lens, next_n, max_pages=6):
    batch = len(seq_lens)
    pages = batch * max_pages + 2
    pool = torch.zeros(pages, PAGE * 132, dtype=torch.uint8)
    cache_store.store_index_keys(pool, torch.randn(pages * PAGE, 128), torch.arange(pages * PAGE), PAGE)
    table = torch.randperm(pages)[: batch * max_pages].view(batch, max_pages).int()
    seq = torch.tensor(seq_lens)
    # verify/draft-extend: token j of a request sees seq - next_n + j + 1 keys, one row per token
    lens = torch.stack([(seq - next_n + j + 1).clamp_min(0) for j in range(next_n)], 1).reshape(-1).int()
    q = (torch.randn(batch * next_n, HEADS, 128) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(batch * next_n, HEADS)
    return q, w, pool, table, lens


def _assert_close(out, want):
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(out))
    assert (out[finite] - want[finite]).abs().max() <= 1e-5 * want[finite].abs().max()


@pytest.mark.parametrize("tma", [False, True], ids=["gathered", "tma"])
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_paged_logits_match_reference_for_every_next_n(next_n, tma):
    q, w, pool, table, lens = _paged_inputs([37, 70, 5], next_n)
    out = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, 96, next_n, config=dict(SMALL_TILES, TMA=tma))
    _assert_close(out, reference.paged_indexer_logits_ref(q, w, pool, table, lens, PAGE, 96, next_n))


def test_tma_tiles_must_lie_inside_a_page():
    q, w, pool, table, lens = _paged_inputs([20, 33], 1)
    with pytest.raises(ValueError, match="inside a page"):
        indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, 40, 1,
                                            config=dict(SMALL_TILES, BLOCK_K=32, TMA=True))


def test_default_config_uses_tma_only_for_next_n_1_on_pages_of_whole_tiles():
    assert indexer_logits.paged_config(128, 32768, 1, page_size=64)["TMA"]
    assert not indexer_logits.paged_config(128, 32768, 1, page_size=16)["TMA"]
    assert not indexer_logits.paged_config(128, 32768, 2, page_size=64)["TMA"]


def test_gpus_before_hopper_gather_every_tile(monkeypatch):
    """TMA exists from sm_90 on: an Ada GPU (8.9) takes the gathered loads at next_n 1 too."""
    assert not indexer_logits.paged_config(128, 32768, 1, page_size=64, tma=False)["TMA"]
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(indexer_logits, "capability", lambda device: (8, 9))
    assert not indexer_logits._has_tma(cuda)
    monkeypatch.setattr(indexer_logits, "capability", lambda device: (9, 0))
    assert indexer_logits._has_tma(cuda)
    assert indexer_logits._has_tma(torch.device("cpu"))  # the interpreter emulates TMA


def test_decode_logits_fall_back_to_triton_when_the_gluon_kernel_does_not_compile(monkeypatch, caplog):
    # as on Hopper with a Triton whose Gluon API the kernel does not match
    monkeypatch.setattr(gluon_compat, "_BROKEN", set())
    monkeypatch.setattr(indexer_gluon, "runs_on", lambda device: True)
    monkeypatch.setattr(indexer_logits, "gluon_paged_config", lambda *args: dict(KEYS_PER_PROG=1024, STAGES=4))

    def does_not_compile(*args):
        raise CompilationError(None, None, "AttributeError: a Gluon name this Triton renamed")

    monkeypatch.setattr(indexer_gluon, "paged_indexer_logits", does_not_compile)
    q, w, pool, table, lens = _paged_inputs([37, 70, 5], 1)
    with caplog.at_level(logging.WARNING):
        out = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, 96, 1)
    assert "does not compile" in caplog.text
    _assert_close(out, reference.paged_indexer_logits_ref(q, w, pool, table, lens, PAGE, 96, 1))
    assert not indexer_logits.gluon_paged_runs(torch.device("cpu"), 64)  # not tried again in this process


def test_the_default_path_gives_the_gluon_kernel_the_config_of_its_head_count(monkeypatch):
    # as on an H100: next_n 4 at 32 heads (GLM-5's indexer) has chunks of its own, 64 DeepSeek's
    monkeypatch.setattr(gluon_compat, "_BROKEN", set())
    monkeypatch.setattr(indexer_gluon, "runs_on", lambda device: True)
    monkeypatch.setattr(indexer_logits, "num_sms", lambda device: 132)
    launched = []
    monkeypatch.setattr(indexer_gluon, "paged_indexer_logits", lambda *args: launched.append(args[-1]))
    batch, ctx, next_n, page = 24, 32768, 4, 64
    pool = torch.zeros(1, page * 132, dtype=torch.uint8)
    table = torch.zeros(batch, ctx // page, dtype=torch.int32)
    lens = torch.full((batch * next_n,), ctx, dtype=torch.int32)
    for heads in (32, 64):
        q = torch.zeros(batch * next_n, heads, 128).to(torch.float8_e4m3fn)
        indexer_logits.paged_indexer_logits(q, torch.zeros(batch * next_n, heads), pool, table, lens, page, ctx, next_n)
    assert [c["KEYS_PER_PROG"] for c in launched] == [2048, 1024]
    assert launched == [indexer_gluon.gluon_config(batch, ctx, next_n, 132, heads) for heads in (32, 64)]


def test_a_triton_without_tma_descriptors_gathers_every_tile(monkeypatch):
    monkeypatch.setattr(indexer_logits, "TensorDescriptor", None)
    assert not indexer_logits.paged_config(128, 32768, 1, page_size=64)["TMA"]
    q, w, pool, table, lens = _paged_inputs([37, 70], 1)
    with pytest.raises(ValueError, match="tensor_descriptor"):
        indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, 96, 1, config=dict(SMALL_TILES, TMA=True))


def test_paged_logits_accept_a_per_token_block_table_and_2d_lengths():
    q, w, pool, table, lens = _paged_inputs([20, 33], 2)
    per_token = table.repeat_interleave(2, dim=0)
    out = indexer_logits.paged_indexer_logits(q, w, pool, per_token, lens[:, None], PAGE, 40, 2, config=SMALL_TILES)
    _assert_close(out, reference.paged_indexer_logits_ref(q, w, pool, table, lens, PAGE, 40, 2))


def test_paged_logits_without_cleaning_write_every_visible_column():
    q, w, pool, table, lens = _paged_inputs([0, 1, 17], 1)
    out = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, PAGE, 64, 1, clean_logits=False,
                                              config=dict(SMALL_TILES, TMA=True))
    want = reference.paged_indexer_logits_ref(q, w, pool, table, lens, PAGE, 64, 1)
    for i, n in enumerate(lens.tolist()):
        assert torch.allclose(out[i, :n], want[i, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "visible-only"])
def test_ragged_logits_match_reference_with_causal_ranges(clean):
    nq, nk = 11, 50
    q = (torch.randn(nq, HEADS, 128) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(nq, HEADS)
    k = torch.randn(nk, 128).to(torch.float8_e4m3fn)
    k_scale = torch.rand(nk)
    # two sequences: keys [0, 4) and [20, 50), causal inside each; one query with an empty range
    k_start = torch.tensor([0] * 4 + [20] * 7).int()
    k_end = torch.tensor([1, 2, 3, 4, 20, 21, 22, 30, 40, 50, 43]).int()
    cfg = dict(BLOCK_Q=2, BLOCK_K=16, KEYS_PER_PROG=32, num_warps=4, num_stages=1)
    out = indexer_logits.ragged_indexer_logits(q, w, k, k_scale, k_start, k_end, clean_logits=clean, config=cfg)
    want = reference.ragged_indexer_logits_ref(q, w, k, k_scale, k_start, k_end)
    if clean:
        _assert_close(out, want)
    else:  # each query's own range is written; what lies outside it is never read
        for i, (lo, hi) in enumerate(zip(k_start.tolist(), k_end.tolist())):
            if hi > lo:
                _assert_close(out[i, lo:hi], want[i, lo:hi])


def test_fill_past_lengths_writes_only_each_rows_tail():
    wide = torch.randn(5, 310)
    out = wide[:, :300]  # strided rows, as DeepGEMM's padded output
    lens = torch.tensor([0, 1, 299, 300, 150]).int()
    want = wide.clone()
    want[:, :300].masked_fill_(torch.arange(300)[None, :] >= lens[:, None].long(), float("-inf"))
    indexer_logits.fill_past_lengths(out, lens)
    assert torch.equal(wide, want)  # the padding past column 300 untouched


def test_paged_logits_reject_lengths_that_are_not_one_per_token():
    q, w, pool, table, lens = _paged_inputs([20, 33], 2)
    with pytest.raises(ValueError, match="one length per query token"):
        indexer_logits.paged_indexer_logits(q, w, pool, table, lens[::2], PAGE, 40, 2)


def test_gluon_paged_kernel_config_follows_the_grid():
    def cfg(keys_per_prog, stages, overlap, unrolled=False):
        return dict(KEYS_PER_PROG=keys_per_prog, STAGES=stages, OVERLAP=overlap, UNROLLED=unrolled)

    assert not indexer_gluon.runs_on(torch.device("cpu"))
    assert indexer_gluon.gluon_config(128, 32768, 1, 132) == cfg(1024, 4, True)
    assert indexer_gluon.gluon_config(32, 32768, 1, 132)["KEYS_PER_PROG"] == 2048  # one wave of 2048-key programs
    assert indexer_gluon.gluon_config(128, 131072, 1, 132)["KEYS_PER_PROG"] == 1024  # no wave fits either
    assert indexer_gluon.gluon_config(128, 4096, 1, 132)["KEYS_PER_PROG"] == 1024  # three programs an SM and more
    assert indexer_gluon.gluon_config(9, 32768, 1, 132)["KEYS_PER_PROG"] == 1024  # two and more
    # fewer: the longest chunk up to 512 keys that gives 1.5 programs an SM, else 64 keys
    assert indexer_gluon.gluon_config(8, 32768, 1, 132)["KEYS_PER_PROG"] == 512
    assert indexer_gluon.gluon_config(32, 4096, 1, 132) == cfg(512, 4, True)
    assert indexer_gluon.gluon_config(8, 8192, 1, 132)["KEYS_PER_PROG"] == 256
    assert indexer_gluon.gluon_config(1, 32768, 1, 132)["KEYS_PER_PROG"] == 128
    assert indexer_gluon.gluon_config(1, 4096, 1, 132)["KEYS_PER_PROG"] == 64
    # next_n 2 / 4: the longest chunk that still gives every SM a program (else 128 keys if half
    # the SMs get one, else 64); each program waits for its MMA once the grid has more than four
    # programs an SM (at next_n 2 two tiles an iteration)
    assert indexer_gluon.gluon_config(128, 32768, 2, 132) == cfg(2048, 2, False, unrolled=True)
    assert indexer_gluon.gluon_config(32, 32768, 2, 132) == cfg(2048, 4, True)
    assert indexer_gluon.gluon_config(128, 32768, 4, 132) == cfg(1024, 2, False)
    assert indexer_gluon.gluon_config(128, 4096, 4, 132) == cfg(1024, 4, True)
    assert indexer_gluon.gluon_config(67, 4096, 4, 132) == cfg(1024, 4, True)  # 268 programs
    assert indexer_gluon.gluon_config(32, 4096, 2, 132) == cfg(512, 4, True)
    assert indexer_gluon.gluon_config(1, 32768, 2, 132) == cfg(128, 4, True)
    # next_n 4 grids of at most two programs an SM: programs of two tokens, with next_n 2's config
    # at twice the requests
    pairs = dict(TOKENS_A_PROGRAM=2)
    assert indexer_gluon.gluon_config(66, 4096, 4, 132) == dict(cfg(2048, 4, True), **pairs)  # 264 programs
    assert indexer_gluon.gluon_config(32, 4096, 4, 132) == dict(cfg(1024, 4, True), **pairs)
    assert indexer_gluon.gluon_config(2, 32768, 4, 132) == dict(cfg(512, 4, True), **pairs)
    assert indexer_gluon.gluon_config(2, 8192, 4, 132) == dict(cfg(128, 4, True), **pairs)
    assert indexer_gluon.gluon_config(1, 8192, 4, 132) == dict(cfg(128, 4, True), **pairs)
    # any other next_n: one program a query token, with next_n 1's config at batch * next_n rows ...
    assert indexer_gluon.gluon_config(1, 32768, 3, 132) == dict(cfg(256, 4, True), TOKENS_A_PROGRAM=1)
    assert indexer_gluon.gluon_config(128, 32768, 3, 132) == dict(cfg(1024, 4, True), TOKENS_A_PROGRAM=1)
    assert indexer_gluon.gluon_config(8, 8192, 5, 132) == dict(indexer_gluon.gluon_config(40, 8192, 1, 132),
                                                              TOKENS_A_PROGRAM=1)
    # ... or of two, with next_n 2's at batch * ceil(next_n / 2): from next_n 7, and from 5 where
    # those programs are more than four an SM
    assert indexer_gluon.gluon_config(8, 8192, 6, 132) == dict(indexer_gluon.gluon_config(48, 8192, 1, 132),
                                                              TOKENS_A_PROGRAM=1)
    assert indexer_gluon.gluon_config(8, 8192, 7, 132) == dict(indexer_gluon.gluon_config(32, 8192, 2, 132),
                                                              TOKENS_A_PROGRAM=2)
    assert indexer_gluon.gluon_config(32, 32768, 5, 132) == dict(cfg(2048, 2, False, unrolled=True),
                                                                TOKENS_A_PROGRAM=2)
    # at 32 heads or fewer next_n 4 takes 2048-key chunks where they make one wave that loads no
    # SM with more keys than 1024-key chunks would, and waits for each MMA past two programs an SM
    for heads in (32, 16):
        assert indexer_gluon.gluon_config(32, 32768, 4, 132, heads) == cfg(2048, 2, False)  # 512 programs
        assert indexer_gluon.gluon_config(24, 32768, 4, 132, heads) == cfg(2048, 2, False)  # 384
        assert indexer_gluon.gluon_config(128, 4096, 4, 132, heads) == dict(cfg(2048, 4, True), **pairs)  # 256
        # 320 programs of 2048 keys: three on some SMs, against at most five of 1024
        assert indexer_gluon.gluon_config(20, 32768, 4, 132, heads) == cfg(1024, 2, False)
        assert indexer_gluon.gluon_config(80, 16384, 4, 132, heads) == cfg(1024, 2, False)  # 2048: past a wave
        assert indexer_gluon.gluon_config(128, 32768, 2, 132, heads) == cfg(2048, 2, False, unrolled=True)
        # 1024-key chunks at two to three programs an SM: programs of two tokens, one MMA at a time
        mid = dict(cfg(1024, 2, False, unrolled=True), **pairs)
        assert indexer_gluon.gluon_config(10, 32768, 4, 132, heads) == mid  # 320 programs of four tokens
        assert indexer_gluon.gluon_config(67, 4096, 4, 132, heads) == mid  # 268
        assert indexer_gluon.gluon_config(99, 4096, 4, 132, heads) == mid  # 396
        assert indexer_gluon.gluon_config(3, 131072, 4, 132, heads) == mid  # 384
    assert indexer_gluon.gluon_config(24, 32768, 4, 132, 64) == cfg(1024, 2, False)
    assert indexer_gluon.gluon_config(10, 32768, 4, 132, 64) == cfg(1024, 4, True)


def test_gluon_paged_kernel_keeps_logits_in_l2_only_when_they_fit_half_of_it(monkeypatch):
    # the device's properties stand in for a Hopper's 50 MB of L2
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(L2_cache_size=50 << 20))
    def policy(rows, width):
        return indexer_gluon._logits_eviction(torch.empty(rows, width, device="meta"))
    assert policy(32, 32768) == "evict_last"  # 4 MiB
    assert policy(128, 32768) == "evict_last"  # 16 MiB
    assert policy(128, 131072) == ""  # 64 MiB: more than L2 holds


def test_pool_parts_are_the_keys_and_scales_the_kernels_read():
    q, w, pool, table, lens = _paged_inputs([37], 1)
    keys, scales = indexer_logits.pool_parts(pool, PAGE)
    assert keys.shape == (pool.shape[0], PAGE, 128) and scales.shape == (pool.shape[0], PAGE)
    page = pool[3]
    assert torch.equal(keys[3].view(torch.uint8).reshape(-1), page[: PAGE * 128])
    assert torch.equal(scales[3], page[PAGE * 128:].view(torch.float32))
    assert indexer_logits.gluon_paged_config(torch.device("cpu"), 128, 32768, 1, 64) is None


def _deepseek_paged_case(next_n, seq=(4999, 1, 3001, 64, 2100), heads=64):
    # DeepSeek shapes (64 heads, 64-key pages; GLM-5 has 32 heads); lengths off every tile, chunk and page boundary
    page = 64
    seq = torch.tensor(seq)
    per_request = int(seq.max()) // page + 2
    pages = len(seq) * per_request + 1
    pool = torch.zeros(pages, page * 132, dtype=torch.uint8, device="cuda")
    cache_store.store_index_keys(pool, torch.randn(pages * page, 128, device="cuda"),
                                 torch.arange(pages * page, device="cuda"), page)
    table = torch.randperm(pages, device="cuda")[: len(seq) * per_request].view(len(seq), per_request).int()
    lens = torch.stack([(seq - next_n + j + 1).clamp_min(0) for j in range(next_n)], 1).reshape(-1).int().cuda()
    q = (torch.randn(len(seq) * next_n, heads, 128, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = torch.randn(len(seq) * next_n, heads, device="cuda")
    return q, w, pool, table, lens


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("chunk, stages, overlap, unrolled", [
    *[(chunk, stages, overlap, False) for overlap in (True, False)
      for chunk, stages in [(1024, 4), (2048, 3), (1024, 2), (128, 4), (64, 4)]],
    (2048, 2, False, True), (1024, 4, False, True), (128, 2, False, True),
], ids=[*[f"{schedule}-{shape}" for schedule in ("overlapped", "one-mma-at-a-time")
          for shape in ("1024", "2048", "two-stages", "fewer-tiles-than-stages", "one-tile")],
        "unrolled-2048", "unrolled-four-stages", "unrolled-one-iteration"])
def test_gluon_paged_kernel_equals_the_triton_kernel_on_cuda(chunk, stages, overlap, unrolled, clean, next_n):
    max_len = 5000
    q, w, pool, table, lens = _deepseek_paged_case(next_n)
    got = indexer_gluon.paged_indexer_logits(q, w, *indexer_logits.pool_parts(pool, 64), table, lens, max_len, next_n,
                                             clean, dict(KEYS_PER_PROG=chunk, STAGES=stages, OVERLAP=overlap,
                                                         UNROLLED=unrolled))
    cfg = dict(indexer_logits.paged_config(len(lens) // next_n, max_len, next_n, page_size=64), TMA=False)
    want = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, 64, max_len, next_n, clean, config=cfg)
    visible = torch.arange(max_len, device="cuda")[None, :] < (max_len if clean else lens[:, None])
    assert torch.equal(torch.where(visible, got, 0.0), torch.where(visible, want, 0.0))


@pytest.mark.gpu
@pytest.mark.parametrize("next_n, per_program", [(2, 1), (3, 1), (3, 2), (4, 2), (5, 2), (5, 4), (6, 2), (8, 4)])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("chunk, overlap", [(1024, True), (64, True), (2048, False)],
                         ids=["1024", "one-tile", "one-mma-at-a-time"])
def test_gluon_programs_of_some_of_a_requests_tokens_equal_the_triton_kernel_on_cuda(chunk, overlap, clean, next_n,
                                                                                     per_program):
    """A request's tokens in programs of per_program (the last one ending at its last token, so
    repeating tokens of the one before where per_program does not divide next_n)."""
    max_len = 5000
    q, w, pool, table, lens = _deepseek_paged_case(next_n)
    cfg = dict(KEYS_PER_PROG=chunk, STAGES=4 if overlap else 2, OVERLAP=overlap, UNROLLED=False,
               TOKENS_A_PROGRAM=per_program)
    got = indexer_gluon.paged_indexer_logits(q, w, *indexer_logits.pool_parts(pool, 64), table, lens, max_len, next_n,
                                             clean, cfg)
    want = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, 64, max_len, next_n, clean, config=dict(
        indexer_logits.paged_config(len(lens) // next_n, max_len, next_n, page_size=64), TMA=False))
    visible = torch.arange(max_len, device="cuda")[None, :] < (max_len if clean else lens[:, None])
    assert torch.equal(torch.where(visible, got, 0.0), torch.where(visible, want, 0.0))


@pytest.mark.gpu
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("next_n", [1, 2])
def test_deepgemm_paged_logits_through_the_dispatch_match_the_reference(next_n, clean):
    """DeepGEMM's paged logits as the dispatch calls them: its 2-D lengths, and the -inf past each
    token's length filled by the dispatch (DeepGEMM 0.1.4 refuses to clean them on SM90)."""
    pytest.importorskip("deep_gemm")
    from dsa_kernels import dispatch

    page, max_len = 64, 5000
    q, w, pool, table, lens = _deepseek_paged_case(next_n)
    out = dispatch.paged_indexer_logits(q, w, pool, table, lens, page_size=page, max_context_len=max_len,
                                        next_n=next_n, clean_logits=clean, backend="deepgemm")
    want = reference.paged_indexer_logits_ref(q, w, pool, table, lens, page, max_len, next_n)
    visible = torch.arange(max_len, device="cuda")[None, :] < lens[:, None]
    if clean:
        assert torch.equal(torch.isfinite(want), torch.isfinite(out))
    diff = torch.where(visible, out - want, 0.0).abs().max()
    assert diff <= 1e-3 * torch.where(visible, want, 0.0).abs().max()  # fp8 MMA accumulation, as below


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("batch, ctx", [(80, 16384), (2, 5000)], ids=["large-grid", "small-grid"])
def test_paged_logits_take_the_gluon_kernel_on_hopper_and_match_triton(next_n, batch, ctx):
    hopper = torch.cuda.get_device_capability() == (9, 0)
    gluon_cfg = indexer_logits.gluon_paged_config(torch.device("cuda"), batch, ctx, next_n, 64)
    assert (gluon_cfg is not None) == hopper
    # next_n 3: programs of a token; 4: of two on the small grid; 6: of two on the large, of one on the small
    if hopper:
        small = batch == 2
        assert gluon_cfg.get("TOKENS_A_PROGRAM") == {3: 1, 4: 2 if small else None, 6: 1 if small else 2}.get(next_n)
    if hopper and batch == 80:  # next_n 2 / 4 / 6: 640 / 1280 / 1920 programs, more than four an SM: one MMA at a time
        assert gluon_cfg["OVERLAP"] == (next_n in (1, 3)) and gluon_cfg["UNROLLED"] == (next_n in (2, 6))
    if hopper and batch == 2:  # a few programs: one to four key tiles each
        assert gluon_cfg["KEYS_PER_PROG"] == {1: 64, 6: 256}.get(next_n, 128)
    q, w, pool, table, lens = _deepseek_paged_case(next_n, seq=[ctx - 3 * i for i in range(batch)])
    got = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, 64, ctx, next_n)
    cfg = dict(indexer_logits.paged_config(batch, ctx, next_n, page_size=64))
    assert torch.equal(got, indexer_logits.paged_indexer_logits(q, w, pool, table, lens, 64, ctx, next_n, config=cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [32, 16], ids=["glm5-heads", "tiny-heads"])
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize("batch, ctx", [(80, 16384), (24, 32768), (10, 32768), (2, 5000)],
                         ids=["large-grid", "one-wave", "mid-grid", "small-grid"])
def test_gluon_paged_kernel_at_fewer_heads_equals_triton_and_the_reference(heads, next_n, batch, ctx):
    """GLM-5's indexer has 32 heads and the tiny checkpoints 16: an MMA unit is then N = 32 or 16
    columns a token. Every schedule the default path picks there (the large grid one MMA at a
    time at next_n 2 and 4, at next_n 4 one wave of 2048-key programs, the mid grid at next_n 4
    programs of two tokens one MMA at a time, the small grid overlapped, next_n 3 and 4 in
    programs of some of a request's tokens) gives the Triton kernel's logits bit for bit."""
    q, w, pool, table, lens = _deepseek_paged_case(next_n, seq=[ctx - 3 * i for i in range(batch)], heads=heads)
    got = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, 64, ctx, next_n)
    cfg = dict(indexer_logits.paged_config(batch, ctx, next_n, page_size=64))
    assert torch.equal(got, indexer_logits.paged_indexer_logits(q, w, pool, table, lens, 64, ctx, next_n, config=cfg))
    want = reference.paged_indexer_logits_ref(q, w, pool, table, lens, 64, ctx, next_n)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    assert (got[finite] - want[finite]).abs().max() <= 1e-3 * want[finite].abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize("tma", [False, True], ids=["gathered", "tma"])
def test_compiled_paged_kernel_matches_the_reference_on_cuda(next_n, tma):
    page, max_len = 64, 5000
    q, w, pool, table, lens = _deepseek_paged_case(next_n)
    cfg = dict(indexer_logits.paged_config(len(lens) // next_n, max_len, next_n, page_size=page), TMA=tma)
    out = indexer_logits.paged_indexer_logits(q, w, pool, table, lens, page, max_len, next_n, config=cfg)
    want = reference.paged_indexer_logits_ref(q, w, pool, table, lens, page, max_len, next_n)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(out))
    # Hopper's fp8 MMA accumulates with reduced precision (DeepGEMM's own test allows 1e-3)
    assert (out[finite] - want[finite]).abs().max() <= 1e-3 * want[finite].abs().max()


@pytest.mark.gpu
def test_compiled_ragged_kernel_matches_the_reference_on_cuda():
    # two prefill sequences back to back, causal inside each, with the default tiles
    nq, nk = 301, 2500
    q = (torch.randn(nq, 64, 128, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = torch.randn(nq, 64, device="cuda")
    k = torch.randn(nk, 128, device="cuda").to(torch.float8_e4m3fn)
    k_scale = torch.rand(nk, device="cuda")
    first = torch.arange(nq, device="cuda") < 120
    k_start = torch.where(first, 0, 1000).int()
    k_end = torch.where(first, 880 + torch.arange(nq, device="cuda"), 2500 - 300 + torch.arange(nq, device="cuda")).int()
    out = indexer_logits.ragged_indexer_logits(q, w, k, k_scale, k_start, k_end)
    want = reference.ragged_indexer_logits_ref(q, w, k, k_scale, k_start, k_end)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(out))
    assert (out[finite] - want[finite]).abs().max() <= 1e-3 * want[finite].abs().max()

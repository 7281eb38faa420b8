"""The dispatch layer: references on the CPU, clear errors for missing metadata, no hard deps."""

import logging
from types import SimpleNamespace

import pytest
import torch

import dsa_kernels
from dsa_kernels import dispatch, reference


def test_cpu_uses_the_references_and_needs_no_gpu_library():
    assert dispatch._choose(torch.zeros(1), "auto", "deepgemm") == "reference"
    assert dsa_kernels.available_backends("cpu") == {
        "reference": True, "triton": False, "deepgemm": False, "flashmla": False, "gluon_paged_indexer": False,
        "gluon_sparse_mla": False}


def test_ours_is_auto_without_the_libraries(monkeypatch):
    monkeypatch.setattr(dispatch, "_library", lambda name: pytest.fail(f"'ours' asked for {name}"))
    assert dispatch._choose(torch.zeros(1), "ours", "deepgemm") == "reference"
    assert dispatch._choose(SimpleNamespace(is_cuda=True), "ours", "deepgemm") == "triton"


def test_a_gpu_without_e4m3_kernels_runs_fp8_calls_on_the_references(monkeypatch, caplog):
    """An A100 (8.0): Triton compiles no e4m3 there, so the FP8 calls take the references (on the
    GPU) under auto and ours; the rest stay on our kernels; a named backend is taken as named."""
    gpu = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    monkeypatch.setattr(dispatch, "_library", lambda name: object())  # DeepGEMM and FlashMLA load
    monkeypatch.setattr(dispatch, "capability", lambda device: (8, 0))
    dispatch._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert dispatch._choose(gpu, "auto", "deepgemm", fp8=True) == "reference"  # the libraries need SM90
        assert dispatch._choose(gpu, "ours", None, fp8=True) == "reference"
    assert "(8, 0)" in caplog.text and "references" in caplog.text
    assert dispatch._choose(gpu, "auto", None) == "triton"  # top-k, bf16 sparse MLA
    assert dispatch._choose(gpu, "triton", None, fp8=True) == "triton"
    monkeypatch.setattr(dispatch, "capability", lambda device: (8, 9))  # Ada: e4m3 compiles, no libraries
    assert dispatch._choose(gpu, "auto", "deepgemm", fp8=True) == "triton"
    monkeypatch.setattr(dispatch, "capability", lambda device: (9, 0))
    assert dispatch._choose(gpu, "auto", "deepgemm", fp8=True) == "deepgemm"


def test_an_absent_library_is_not_an_error():
    assert dispatch._library("no_such_kernel_library_xyz") is None


def test_ragged_topk_without_offsets_raises_a_clear_error():
    with pytest.raises(RuntimeError, match="offsets"):
        dsa_kernels.topk_transform(torch.randn(2, 8), torch.tensor([8, 8]), 4, "ragged")


def test_paged_topk_without_a_block_table_raises():
    with pytest.raises(RuntimeError, match="block_table"):
        dsa_kernels.topk_transform(torch.randn(2, 8), torch.tensor([8, 8]), 4, "paged", page_size=4)


def test_unknown_topk_method_is_rejected():
    with pytest.raises(ValueError, match="paged"):
        dsa_kernels.topk_transform(torch.randn(1, 8), torch.tensor([8]), 4, "dense")


def test_ragged_logits_without_offsets_raise():
    q = torch.zeros(1, 4, 128).to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="k_start"):
        dsa_kernels.ragged_indexer_logits(q, torch.zeros(1, 4), q[0], torch.ones(4), None, None)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_topk_backends_agree(backend):
    logits = torch.randn(4, 64)
    lens = torch.tensor([0, 3, 40, 64])
    table = torch.arange(16).view(4, 4).int()
    out = dsa_kernels.topk_transform(logits, lens, 8, "paged", block_table=table, page_size=16, backend=backend)
    want = reference.paged_transform_ref(reference.topk_positions_ref(logits, lens, 8), table, 16)
    assert torch.equal(out, want)


def test_reference_hadamard_is_orthonormal():
    h = reference.hadamard_matrix(128)
    assert torch.allclose(h @ h.T, torch.eye(128), atol=1e-5)


def test_transformers_still_imports_next_to_dsa_kernels():
    import transformers  # noqa: F401 - `kernels` must not shadow the Hugging Face package

    assert dsa_kernels.__name__ == "dsa_kernels"


def test_a_capture_takes_flashmla_only_for_a_shape_it_has_run(monkeypatch, caplog):
    """The rule alone (the GPU test below runs it in real captures): outside a capture, or for a
    shape FlashMLA has run, yes; inside a capture for a new shape, our kernel with a warning under
    auto, a clear error when FlashMLA is named."""
    q, pool, idx = torch.zeros(2, 64, 576), torch.zeros(128, 656, dtype=torch.uint8), torch.zeros(2, 2048)
    key = dispatch._flashmla_key(q, pool, idx)
    dispatch._FLASH_MLA_META.pop(key, None)
    dispatch._warn_once.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert dispatch._flashmla_schedule_ready(q, pool, idx, "flashmla")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with caplog.at_level("WARNING", logger=dispatch.__name__):
        assert not dispatch._flashmla_schedule_ready(q, pool, idx, "auto")
    assert "takes the Triton kernel" in caplog.text
    with pytest.raises(RuntimeError, match="run the shape once before capturing"):
        dispatch._flashmla_schedule_ready(q, pool, idx, "flashmla")
    dispatch._FLASH_MLA_META[key] = object()  # as an eager call leaves it
    try:
        assert dispatch._flashmla_schedule_ready(q, pool, idx, "flashmla")
    finally:
        del dispatch._FLASH_MLA_META[key]


@pytest.mark.gpu
def test_flashmla_decode_enters_a_graph_only_after_an_eager_call_of_its_shape(caplog):
    """FlashMLA makes a shape's split schedule on its first call. A capture that meets the shape
    first takes our kernel (or fails, with FlashMLA named explicitly); after an eager call, graphs
    captured later share the schedule and replay in any order."""
    pytest.importorskip("flash_mla")
    n, heads, slots, topk = 4, 128, 8192, 2048  # batch 4: a shape no other test runs first, FlashMLA's under auto
    g = torch.Generator(device="cuda").manual_seed(5)
    pool = torch.empty(slots, 656, dtype=torch.uint8, device="cuda")
    dsa_kernels.store_mla_kv(pool, torch.randn(slots, 512, device="cuda", generator=g).bfloat16(),
                             torch.randn(slots, 64, device="cuda", generator=g).bfloat16(),
                             torch.arange(slots, device="cuda"))
    q = torch.randn(n, heads, 576, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, slots, (n, topk), device="cuda", generator=g, dtype=torch.int32)
    scale = 576**-0.5
    assert not dispatch._ours_instead_of_flashmla(q, pool, topk)  # auto's choice at this shape is FlashMLA
    dispatch._FLASH_MLA_META.pop(dispatch._flashmla_key(q, pool, idx), None)
    dispatch._warn_once.cache_clear()  # the warning comes once a process

    def captured(backend="auto"):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = dsa_kernels.sparse_mla_decode(q, pool, idx, scale, backend=backend)
        return graph, out

    with caplog.at_level("WARNING", logger=dispatch.__name__):
        cold = captured()
    assert "takes the Triton kernel" in caplog.text
    with pytest.raises(RuntimeError, match="before capturing"):
        captured("flashmla")
    ours = dsa_kernels.sparse_mla_decode(q, pool, idx, scale, backend="triton")[0]
    theirs = dsa_kernels.sparse_mla_decode(q, pool, idx, scale)[0]  # makes the schedule, eagerly
    torch.cuda.synchronize()
    assert dispatch._flashmla_key(q, pool, idx) in dispatch._FLASH_MLA_META
    first, second = captured(), captured()
    for (graph, out), want in ((second, theirs), (first, theirs), (cold, ours), (second, theirs)):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


def test_batch_invariant_mode_keeps_the_libraries_out_of_auto(monkeypatch):
    """FlashMLA's decode schedule follows the batch, auto picks the paged indexer by the call's
    shape, and a decode token in a mixed batch takes the prefill entries: under the mode every
    entry runs our kernel (as here on a Hopper with both libraries)."""
    from dsa_kernels import batch_invariant, indexer_logits, sparse_mla

    monkeypatch.setattr(dispatch, "_choose", lambda t, backend, library, fp8=False: library or "triton")
    monkeypatch.setattr(dispatch, "_flashmla_schedule_ready", lambda *args: True)
    monkeypatch.setattr(dispatch, "_flashmla_decode", lambda *args: ("flashmla", None))
    monkeypatch.setattr(dispatch, "_deepgemm_paged", lambda *args: "deepgemm")
    monkeypatch.setattr(dispatch, "_library", lambda name: SimpleNamespace(
        flash_mla_sparse_fwd=lambda *a, **k: ("flashmla", None, None), fp8_mqa_logits=lambda *a, **k: "deepgemm"))
    monkeypatch.setattr(sparse_mla, "sparse_mla", lambda *args, **kwargs: ("ours", None))
    monkeypatch.setattr(indexer_logits, "paged_indexer_logits", lambda *args, **kwargs: "ours")
    monkeypatch.setattr(indexer_logits, "ragged_indexer_logits", lambda *args, **kwargs: "ours")
    q, pool, idx = torch.zeros(2, 64, 576), torch.zeros(128, 656, dtype=torch.uint8), torch.zeros(2, 2048)
    q8, w, lens = torch.zeros(2, 64, 128), torch.zeros(2, 64), torch.ones(2, dtype=torch.int32)

    def entries(backend="auto"):
        return (dispatch.sparse_mla_decode(q, pool, idx, 0.1, backend=backend)[0],
                dispatch.sparse_mla_prefill(q, torch.zeros(128, 576), idx, 0.1, backend=backend)[0],
                dispatch.paged_indexer_logits(q8, w, pool, lens.view(2, 1), lens, page_size=64, max_context_len=1,
                                              backend=backend),
                dispatch.ragged_indexer_logits(q8, w, q8[:, 0], w[:, 0], lens - 1, lens, backend=backend))

    assert entries() == ("flashmla", "flashmla", "deepgemm", "deepgemm")
    monkeypatch.setattr(batch_invariant, "_ENABLED", True)
    assert entries() == ("ours",) * 4
    assert entries("flashmla")[:2] == ("flashmla",) * 2  # named: as asked
    assert entries("deepgemm")[2:] == ("deepgemm",) * 2


def _on_cuda(*shape):
    return SimpleNamespace(is_cuda=True, shape=shape, device=torch.device("cuda", 0))


def test_auto_takes_our_paged_indexer_but_for_next_n_2_over_large_grids(monkeypatch):
    from dsa_kernels import indexer_logits

    monkeypatch.setattr(indexer_logits, "gluon_paged_runs", lambda device, page_size: True)
    ours = dispatch._ours_instead_of_deepgemm
    assert ours(_on_cuda(128, 64, 128), 131072, 1, 64)  # next_n 1: ours at every grid
    assert ours(_on_cuda(512, 64, 128), 131072, 4, 64)  # next_n 4: DeepGEMM refuses it on SM90
    assert ours(_on_cuda(2 * 127, 64, 128), 32768, 2, 64)
    assert not ours(_on_cuda(2 * 128, 64, 128), 32768, 2, 64)  # DeepGEMM's from 128 rows of 32K keys
    assert not ours(_on_cuda(2 * 32, 64, 128), 131072, 2, 64)
    assert not ours(torch.zeros(1, 64, 128), 4096, 1, 64)  # the CPU: the reference, not ours
    monkeypatch.setattr(indexer_logits, "gluon_paged_runs", lambda device, page_size: False)
    assert not ours(_on_cuda(128, 64, 128), 4096, 1, 64)  # not a Hopper (or no Gluon): the library first


def test_auto_takes_our_sparse_mla_decode_for_up_to_six_units_and_64_head_grids_that_fill_their_waves(monkeypatch):
    from dsa_kernels import sparse_mla

    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    monkeypatch.setattr(sparse_mla, "gluon_runs", lambda q, kv_pool: True)
    pool = torch.zeros(1, 656, dtype=torch.uint8)

    def ours(rows, heads):
        return dispatch._ours_instead_of_flashmla(_on_cuda(rows, heads, 576), pool, 2048)

    assert [rows for rows in range(1, 300) if ours(rows, 128)] == [1, 2, 3]
    # 64 heads: split in one wave over 5/8 of the SMs or more (16 rows in 8 splits, 21-33 in 4, 34-44
    # in 3, 45-66 in 2), or unsplit with the last of at most two waves two thirds full or more
    assert [rows for rows in range(1, 300) if ours(rows, 64)] == [*range(1, 7), 16, *range(21, 67), *range(89, 133),
                                                                   *range(220, 265)]
    assert not dispatch._ours_instead_of_flashmla(torch.zeros(1, 64, 576), pool, 2048)  # the CPU: the reference
    monkeypatch.setattr(sparse_mla, "gluon_runs", lambda q, kv_pool: False)
    assert not ours(1, 128)


@pytest.mark.gpu
def test_the_fp8_stores_run_on_the_references_on_a_gpu_without_e4m3_kernels(monkeypatch):
    """On the GPU, under an A100's capability: the stores write what the reference writes, and no
    Triton store runs (the engine's own path is tests/test_attention.py's)."""
    from dsa_kernels import cache_store

    def e4m3_kernel(*args, **kwargs):
        raise AssertionError("an e4m3 kernel of ours ran")

    monkeypatch.setattr(dispatch, "capability", lambda device: (8, 0))
    monkeypatch.setattr(cache_store, "store_index_keys", e4m3_kernel)
    monkeypatch.setattr(cache_store, "store_mla", e4m3_kernel)
    g = torch.Generator(device="cuda").manual_seed(3)
    keys = torch.randn(40, 128, device="cuda", generator=g).bfloat16()
    latent = torch.randn(40, 512, device="cuda", generator=g).bfloat16()
    rope = torch.randn(40, 64, device="cuda", generator=g).bfloat16()
    slots = torch.randperm(128, device="cuda", generator=g)[:40]
    got, want = (torch.zeros(2, 64 * 132, dtype=torch.uint8, device="cuda") for _ in range(2))
    dsa_kernels.store_index_keys(got, keys, slots, 64, rotate=True)
    reference.store_index_keys_ref(want, keys, slots, 64, rotate=True)
    assert torch.equal(got, want)
    got, want = (torch.zeros(128, 656, dtype=torch.uint8, device="cuda") for _ in range(2))
    dsa_kernels.store_mla_kv(got, latent, rope, slots)
    reference.store_mla_ref(want, latent, rope, slots)
    assert torch.equal(got, want)

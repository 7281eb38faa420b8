"""A serving engine's per-step values (context lengths, logits widths, token counts) must not make
Triton compile the decode kernels again (kernels/specialization.py)."""

import pytest
import torch
import triton

import dsa_kernels
from dsa_kernels import cache_store, indexer_logits, reference
from dsa_kernels.specialization import ROW_ALIGN, logits_rows

PAGE = 64


@pytest.mark.parametrize("width", [1, 15, 16, 17, 2113])
def test_logits_rows_start_every_row_align_floats(width):
    out = logits_rows(3, width, torch.device("cpu"))
    assert out.shape == (3, width) and out.dtype == torch.float32
    assert out.stride() == (-(-width // ROW_ALIGN) * ROW_ALIGN, 1)


def test_indexer_logits_come_in_aligned_rows_whatever_the_width():
    pages, heads = 8, 8
    pool = torch.zeros(pages, PAGE * 132, dtype=torch.uint8)
    cache_store.store_index_keys(pool, torch.randn(pages * PAGE, 128), torch.arange(pages * PAGE), PAGE)
    q = torch.randn(2, heads, 128).to(torch.float8_e4m3fn)
    w = torch.randn(2, heads)
    table = torch.arange(pages).view(2, -1).int()
    paged = indexer_logits.paged_indexer_logits(q, w, pool, table, torch.tensor([37, 70]).int(), PAGE, 70)
    want = reference.paged_indexer_logits_ref(q, w, pool, table, torch.tensor([37, 70]).int(), PAGE, 70)
    assert paged.stride(0) % ROW_ALIGN == 0 and torch.allclose(paged, want, rtol=1e-5, atol=1e-5)
    k_fp8 = torch.randn(70, 128).to(torch.float8_e4m3fn)
    ragged = indexer_logits.ragged_indexer_logits(q, w, k_fp8, torch.rand(70), torch.tensor([0, 30]).int(),
                                                             torch.tensor([37, 70]).int())
    assert ragged.shape == (2, 70) and ragged.stride(0) % ROW_ALIGN == 0


@pytest.mark.gpu
def test_growing_contexts_reuse_the_compiled_decode_kernels(monkeypatch):
    """One decode step's kernels at batch 32 as the longest context grows from 2113 tokens: its
    value and the logits' width turn divisible by 16 at 2128 and 2144, the block table's width at
    48 and 64 pages, and the new token count is 1 or not; none of it may compile a kernel again
    (an H100 stalled 2.5 s at 2128 before)."""
    batch, heads, table_pages = 32, 64, 64
    pages = batch * table_pages
    pool = torch.zeros(pages, PAGE * 132, dtype=torch.uint8, device="cuda")
    cache_store.store_index_keys(pool, torch.randn(pages * PAGE, 128, device="cuda"),
                                 torch.arange(pages * PAGE, device="cuda"), PAGE)
    q = torch.randn(batch, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(batch, heads, device="cuda") * 0.1
    tables = torch.randperm(pages, device="cuda").view(batch, table_pages).int()
    compiled = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", lambda **kw: compiled.append(kw["fn"].name))

    def step(context: int, new_tokens: int, width: int):
        table = tables[:, :width].contiguous()  # the batch's longest block-table row
        lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
        cache_store.store_index_keys(pool, torch.randn(new_tokens, 128, device="cuda"),
                                     torch.arange(new_tokens, device="cuda"), PAGE)
        logits = dsa_kernels.paged_indexer_logits(q, w, pool, table, lens, page_size=PAGE, max_context_len=context,
                                                  clean_logits=False, backend="ours")
        dsa_kernels.topk_transform(logits, lens, 2048, "paged", block_table=table, page_size=PAGE)

    step(2113, 3, 34)  # the first step compiles
    compiled.clear()
    for context, new_tokens, width in [(2114, 1, 34), (2127, 3, 35), (2128, 16, 48), (2129, 2, 34), (2144, 32, 64),
                                       (2150, 1, 34)]:
        step(context, new_tokens, width)
    torch.cuda.synchronize()
    assert compiled == []


@pytest.mark.gpu
@pytest.mark.parametrize("gluon", [True, False], ids=["gluon", "triton"])
def test_split_counts_of_one_config_share_a_compiled_sparse_mla_kernel(monkeypatch, gluon):
    """Sparse MLA's split count follows the batch; splits of 3, 5, 8 and 16 run one kernel config
    (partials merged by the merge kernel), and 16, divisible by 16, used to compile it again."""
    from dsa_kernels import sparse_mla

    if gluon and not sparse_mla.gluon_runs(torch.zeros(1, 64, 576, dtype=torch.bfloat16, device="cuda"),
                                           torch.zeros(64, 656, dtype=torch.uint8, device="cuda")):
        pytest.skip("the Gluon kernel is sm_90 only")
    slots, topk = 4096, 2048
    pool = torch.zeros(slots, 656, dtype=torch.uint8, device="cuda")
    cache_store.store_mla(pool, torch.randn(slots, 512, device="cuda"), torch.randn(slots, 64, device="cuda"),
                          torch.arange(slots, device="cuda"))
    q = torch.randn(2, 64, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, slots, (2, topk), device="cuda").int()
    base = {} if gluon else sparse_mla.mla_config(2, 64, topk)

    def attend(split):
        return sparse_mla.sparse_mla(q, pool, idx, 576**-0.5, config=dict(base, SPLIT=split), gluon=gluon)

    want, _ = attend(3)  # compiles the config
    compiled = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", lambda **kw: compiled.append(kw["fn"].name))
    for split in (5, 8, 16):
        out, _ = attend(split)
        assert (out.float() - want.float()).abs().max() < 2e-2  # the splits' sums round apart
    torch.cuda.synchronize()
    assert "_sparse_mla_kernel" not in compiled

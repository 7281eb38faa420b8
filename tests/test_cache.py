"""Page allocator, the two pools in both layouts, and move_kv_cache."""

from __future__ import annotations

import pytest
import torch

from dsa_backend.cache import KVCache, OutOfPages, PageAllocator, indexer_is_fp8
from dsa_backend.cache import layout
from dsa_backend.config import ModelConfig
from dsa_backend.tools.make_checkpoint import make_config


@pytest.fixture
def config():
    return ModelConfig.from_dict(make_config("glm_moe_dsa", "tiny", index_topk_pattern="FSFS"))


def test_allocator_accounts_pages_and_refuses_overdraw():
    a = PageAllocator(4)
    pages = a.allocate(3)
    assert len(set(pages)) == 3 and a.num_free == 1 and a.num_used == 3
    with pytest.raises(OutOfPages):
        a.allocate(2)
    assert a.num_free == 1  # all-or-nothing
    a.free(pages)
    assert a.num_free == 4


def test_allocator_rejects_double_free():
    a = PageAllocator(2)
    p = a.allocate(1)
    a.free(p)
    with pytest.raises(ValueError, match="double free"):
        a.free(p)


def test_layout_sizes_are_the_design_ones():
    assert layout.MLA_FP8_BYTES == 656 and layout.INDEX_FP8_BYTES == 132


def test_mla_fp8_layout_bytes():
    latent, rope = torch.randn(3, 512), torch.randn(3, 64)
    packed = layout.pack_mla_fp8(latent, rope)
    assert packed.shape == (3, 656) and packed.dtype == torch.uint8
    scales = packed[:, 512:528].contiguous().view(torch.float32)
    assert torch.allclose(scales, latent.view(3, 4, 128).abs().amax(-1) / 448)
    assert torch.equal(packed[:, 528:].contiguous().view(torch.bfloat16), rope.to(torch.bfloat16))
    back = layout.unpack_mla_fp8(packed)
    assert torch.allclose(back[:, :512], latent, rtol=2**-4, atol=scales.max().item() * 2**-9)


def test_pool_sizes_follow_the_indexer_plan(config):
    cache = KVCache(config, num_pages=4, page_size=8, dtype=torch.bfloat16, kv_cache_dtype="fp8")
    layers = config.num_hidden_layers + config.num_nextn_predict_layers
    assert cache.mla.bytes_per_token == layers * 656
    # layers 0 and 2 are full, 1 and 3 shared; the MTP layer has its own indexer
    assert cache.indexer.bytes_per_token == 3 * 132


def test_indexer_fp8_page_holds_values_then_scales(config):
    cache = KVCache(config, num_pages=2, page_size=4, kv_cache_dtype="fp8")
    keys = torch.randn(2, 128)
    cache.indexer.store(0, torch.tensor([5, 6]), keys)  # page 1, offsets 1 and 2
    page = cache.indexer.buffer[0, 1]
    values, scales = layout.quantize_index_keys(keys)
    assert torch.equal(page[128:384], values.view(torch.uint8).reshape(-1))
    assert torch.equal(page[4 * 128 + 4: 4 * 128 + 12], scales.view(torch.uint8))
    assert torch.equal(cache.indexer.buffer[0, 0], torch.zeros_like(cache.indexer.buffer[0, 0]))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_store_then_load_roundtrips(config, kv_cache_dtype):
    cache = KVCache(config, num_pages=3, page_size=4, dtype=torch.float32, kv_cache_dtype=kv_cache_dtype)
    slots = torch.tensor([0, 7, 9])
    latent, rope, keys = torch.randn(3, 512), torch.randn(3, 64), torch.randn(3, 128)
    cache.mla.store(2, slots, latent, rope)
    cache.indexer.store(2, slots, keys)
    exact = kv_cache_dtype == "auto"
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=0.07, atol=0.05)
    torch.testing.assert_close(cache.mla.load(2, slots), torch.cat([latent, rope], -1), **tol)
    torch.testing.assert_close(cache.indexer.load(2, slots), keys, **tol)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_move_kv_cache_moves_both_pools_in_every_layer(config, kv_cache_dtype):
    cache = KVCache(config, num_pages=4, page_size=4, dtype=torch.float32, kv_cache_dtype=kv_cache_dtype)
    src, dst = torch.tensor([9, 10, 13]), torch.tensor([4, 5, 6])
    for layer in range(5):
        cache.mla.store(layer, src, torch.randn(3, 512), torch.randn(3, 64))
        if layer in cache.indexer.index_of_layer:
            cache.indexer.store(layer, src, torch.randn(3, 128))
    cache.move_kv_cache(dst, src)
    for layer in range(5):
        assert torch.equal(cache.mla.load(layer, dst), cache.mla.load(layer, src))
        if layer in cache.indexer.index_of_layer:
            assert torch.equal(cache.indexer.load(layer, dst), cache.indexer.load(layer, src))


def test_move_handles_overlapping_source_and_destination(config):
    # Compaction moves an accepted path to the front: slots 1, 2 <- 2, 3 overlap.
    cache = KVCache(config, num_pages=1, page_size=4, dtype=torch.float32)
    keys = torch.randn(4, 128)
    cache.indexer.store(0, torch.arange(4), keys)
    cache.move_kv_cache(torch.tensor([1, 2]), torch.tensor([2, 3]))
    assert torch.equal(cache.indexer.load(0, torch.tensor([1, 2])), keys[2:4])


def test_bytes_per_page_counts_both_pools(config):
    per_page = KVCache.bytes_per_page(config, 64, "fp8", torch.bfloat16, "cpu")
    assert per_page == 64 * (5 * 656 + 3 * 132)
    # auto on CUDA: a bf16 latent (576 values) and FP8 indexer keys, sized without a GPU
    assert KVCache.bytes_per_page(config, 64, "auto", torch.bfloat16, "cuda") == 64 * (5 * 576 * 2 + 3 * 132)
    assert KVCache.bytes_per_page(config, 64, "auto", torch.bfloat16, "cpu") == 64 * (5 * 576 * 2 + 3 * 128 * 2)


def test_auto_stores_indexer_keys_in_fp8_on_cuda_only():
    assert indexer_is_fp8("auto", "cuda") and indexer_is_fp8("auto", torch.device("cuda", 1))
    assert not indexer_is_fp8("auto", "cpu")
    assert indexer_is_fp8("fp8", "cpu")

"""Triton cache stores write exactly the bytes of dsa_backend.cache.layout (references)."""

import pytest
import torch

from dsa_kernels import cache_store, reference

PAGE = 16


def _index_pool(pages: int) -> torch.Tensor:
    return torch.randint(0, 256, (pages, PAGE * 132), dtype=torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_key_store_is_bit_exact(dtype):
    pool = _index_pool(4)
    keys = (torch.randn(29, 128) * 5).to(dtype)
    slots = torch.randperm(4 * PAGE)[:29]
    slots[7] = -1  # padded row: skipped
    got, want = pool.clone(), pool.clone()
    cache_store.store_index_keys(got, keys, slots, PAGE)
    reference.store_index_keys_ref(want, keys, slots, PAGE)
    assert torch.equal(got, want)


def test_index_key_store_keeps_the_sign_of_a_key_that_rounds_to_zero():
    pool = _index_pool(1)
    keys = torch.zeros(2, 128)
    keys[:, 0] = 100.0
    keys[0, 1], keys[1, 1] = -1e-5, 1e-5  # both round to zero at a scale of 100 / 448
    slots = torch.tensor([0, 1])
    got, want = pool.clone(), pool.clone()
    cache_store.store_index_keys(got, keys, slots, PAGE)
    reference.store_index_keys_ref(want, keys, slots, PAGE)
    assert got[0, 1].item() == 0x80 and got[0, 128 + 1].item() == 0x00
    assert torch.equal(got, want)


def test_rotated_store_matches_within_one_e4m3_step():
    # the fused Hadamard is a matmul with its own fp32 summation order: a value on an e4m3
    # rounding boundary may round the other way, so this one is a tolerance, not bit-exact
    pool = torch.zeros(4, PAGE * 132, dtype=torch.uint8)
    keys = torch.randn(40, 128) * 5
    slots = torch.randperm(4 * PAGE)[:40]
    got, want = pool.clone(), pool.clone()
    cache_store.store_index_keys(got, keys, slots, PAGE, rotate=True)
    reference.store_index_keys_ref(want, keys, slots, PAGE, rotate=True)
    gv, gs = reference.gather_index_keys_ref(got, slots, PAGE)
    wv, ws = reference.gather_index_keys_ref(want, slots, PAGE)
    assert torch.allclose(gs, ws, rtol=1e-6)
    step = wv.float().abs() / 8 + 2**-9  # one e4m3 mantissa step
    assert ((gv.float() - wv.float()).abs() <= step).all()
    assert (gv.view(torch.uint8) != wv.view(torch.uint8)).float().mean() < 0.01


def test_index_key_store_round_trips_through_gather():
    pool = _index_pool(3)
    keys = torch.randn(10, 128)
    slots = torch.tensor([0, 5, 15, 16, 17, 31, 32, 40, 47, 33])
    cache_store.store_index_keys(pool, keys, slots, PAGE)
    values, scales = reference.gather_index_keys_ref(pool, slots, PAGE)
    back = values.float() * scales[:, None]
    assert (back - keys).abs().max() <= keys.abs().amax(1).max() / 16  # e4m3: 3 mantissa bits


def test_index_key_store_handles_zero_rows_and_saturating_values():
    pool = _index_pool(2)
    keys = torch.zeros(3, 128)
    keys[1, 0] = 1e6
    keys[2] = torch.linspace(-130, 130, 128)  # crosses e4m3 power-of-two rounding boundaries
    slots = torch.tensor([1, 2, 3])
    got, want = pool.clone(), pool.clone()
    cache_store.store_index_keys(got, keys, slots, PAGE)
    reference.store_index_keys_ref(want, keys, slots, PAGE)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fp8", [False, True])
def test_mla_store_is_bit_exact(fp8):
    slots_total = 40
    pool = torch.zeros(slots_total, 656, dtype=torch.uint8) if fp8 else torch.zeros(slots_total, 576, dtype=torch.bfloat16)
    latent, rope = torch.randn(13, 512) * 3, torch.randn(13, 64)
    slots = torch.randperm(slots_total)[:13]
    slots[0] = -1
    got, want = pool.clone(), pool.clone()
    cache_store.store_mla(got, latent, rope, slots)
    reference.store_mla_ref(want, latent, rope, slots)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_mla_store_rejects_a_pool_of_the_wrong_width():
    with pytest.raises(ValueError, match="656"):
        cache_store.store_mla(torch.zeros(4, 600, dtype=torch.uint8), torch.randn(1, 512), torch.randn(1, 64),
                              torch.tensor([0]))

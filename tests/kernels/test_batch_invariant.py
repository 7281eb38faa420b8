"""Batch-invariant GEMMs and reductions: right values, and a row's bits independent of its batch."""

import pytest
import torch

from dsa_kernels import batch_invariant as bi


@pytest.mark.parametrize("m,k,n", [(1, 40, 24), (70, 33, 65), (5, 64, 130)])
def test_mm_with_and_without_bias_matches_torch(m, k, n):
    a, b, bias = torch.randn(m, k), torch.randn(n, k).T, torch.randn(n)  # b transposed: strided
    torch.testing.assert_close(bi.mm(a, b), a @ b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bi.mm(a, b, bias), torch.addmm(bias, a, b), rtol=1e-5, atol=1e-5)


def test_bmm_matches_torch_in_bfloat16():
    a, b = torch.randn(3, 9, 40).bfloat16(), torch.randn(3, 40, 17).bfloat16()
    torch.testing.assert_close(bi.bmm(a, b).float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-2)


def test_empty_operands():
    assert bi.mm(torch.randn(0, 8), torch.randn(8, 4)).shape == (0, 4)
    assert torch.equal(bi.mm(torch.randn(3, 0), torch.randn(0, 4)), torch.zeros(3, 4))


def test_a_row_gives_the_same_bits_alone_and_anywhere_in_a_batch():
    w = torch.randn(96, 200)
    row = torch.randn(1, 200)
    alone = bi.mm(row, w.T)
    for m, at in [(2, 1), (64, 37), (130, 129)]:
        batch = torch.randn(m, 200)
        batch[at] = row[0]
        assert torch.equal(bi.mm(batch, w.T)[at], alone[0])


def test_grouped_mm_matches_torch_and_gives_a_row_the_same_bits_in_any_group_size():
    a, b = torch.randn(30, 40), torch.randn(4, 40, 24)
    ends = torch.tensor([7, 7, 29, 29], dtype=torch.int32)  # groups 1 and 3 empty; the last row in none
    out = bi.grouped_mm(a, b, ends)
    torch.testing.assert_close(out[:29], torch._grouped_mm(a[:29], b[:3], offs=ends[:3]), rtol=1e-5, atol=1e-5)
    assert torch.equal(out[29], torch.zeros(24))
    for rows in (slice(8, 9), slice(8, 20)):  # row 8 of group 2 alone and among 12
        alone = bi.grouped_mm(a[rows], b, torch.tensor([0, 0, rows.stop - rows.start, rows.stop - rows.start]))
        assert torch.equal(alone[0], out[8])


def test_grouped_mm_refuses_the_forms_the_engine_does_not_call_naming_them():
    with pytest.raises(ValueError, match="got a 3-D, b 3-D, offs given: False"):
        bi.grouped_mm(torch.randn(2, 3, 4), torch.randn(2, 4, 5))


def test_mixed_dtypes_are_refused_naming_them():
    with pytest.raises(TypeError, match="torch.float32 and torch.bfloat16"):
        bi.mm(torch.randn(2, 2), torch.randn(2, 2).bfloat16())


@pytest.mark.parametrize("dims,keepdim", [([-1], True), ([0, 2], False), (None, False), ([1], False)])
def test_sum_and_mean_match_torch(dims, keepdim):
    x = torch.randn(4, 700, 3)
    torch.testing.assert_close(bi.reduce_sum(x, dims, keepdim), x.sum(dims or list(range(3)), keepdim))
    torch.testing.assert_close(bi.reduce_sum(x, dims, keepdim, mean=True),
                               x.mean(dims or list(range(3)), keepdim))


def test_integer_and_bool_sums_are_exact_int64():
    x = torch.randint(-5, 5, (3, 1000))
    assert torch.equal(bi.reduce_sum(x, [1]), x.sum(1))
    assert torch.equal(bi.reduce_sum(x > 0, [1]), (x > 0).sum(1))


def test_reduction_of_a_row_does_not_depend_on_the_other_rows():
    x = torch.randn(50, 3000)
    alone = bi.reduce_sum(x[7:8], [-1], mean=True)
    assert torch.equal(bi.reduce_sum(x, [-1], mean=True)[7], alone[0])


def test_mean_over_nothing_is_nan_and_integer_sums_widen():
    assert torch.isnan(bi.reduce_sum(torch.zeros(2, 0), [1], mean=True)).all()
    assert torch.equal(bi.reduce_sum(torch.ones(2, 5, dtype=torch.int32), [1]), torch.tensor([5, 5]))


@pytest.mark.gpu
def test_disabling_the_mode_gives_aten_its_cuda_kernels_back():
    a = torch.randn(300, 1536, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1536, 700, device="cuda", dtype=torch.bfloat16)
    cublas = torch.mm(a, b)
    bi.enable_batch_invariant_mode(torch.device("cuda"))
    assert bi.enabled() and torch.equal(torch.mm(a, b), bi.mm(a, b))
    bi.disable_batch_invariant_mode()
    assert not bi.enabled() and torch.equal(torch.mm(a, b), cublas)

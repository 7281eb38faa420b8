"""DeepGEMM's dense FP8 GEMM on two row halves where it is faster (kernels/deepgemm_rows.py)."""

import pytest
import torch

import dsa_kernels
from dsa_backend.weights import quantize_fp8_block
from dsa_kernels import deepgemm_rows, reference

DEEPGEMM = dsa_kernels.available_backends("cuda")["deepgemm"] if torch.cuda.is_available() else False


def _weight(n: int, k: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    w, scale = quantize_fp8_block(torch.randn(n, k) * 0.05, (128, 128))
    return w.to(device), scale.to(device)


class _RecordingLibrary:
    """fp8_gemm_nt on the reference, recording the rows of each call: isolates the split logic."""

    def __init__(self):
        self.rows = []

    def fp8_gemm_nt(self, a_pair, w_pair, out):
        (a, a_scale), (w, w_scale) = a_pair, w_pair
        self.rows.append(a.shape[0])
        out.copy_(reference.fp8_linear_ref(a, a_scale, w, w_scale))


def test_halves_split_each_bucket_into_two_nonempty_parts_on_bucket_bounds():
    for rows in range(deepgemm_rows.BUCKET + 1, 40 * deepgemm_rows.BUCKET):
        first = deepgemm_rows._halves(rows)
        assert 0 < first < rows and first % deepgemm_rows.BUCKET == 0
        assert rows - first <= first  # the first half is the larger


@pytest.mark.parametrize("rows", [130, 192])
def test_a_calibrated_bucket_runs_as_two_calls_that_equal_one(rows, monkeypatch):
    w, w_scale = _weight(256, 256)
    a, a_scale = dsa_kernels.quantize_act(torch.randn(rows, 256))
    library = _RecordingLibrary()
    whole = deepgemm_rows.gemm(library, a, a_scale, w, w_scale)
    assert library.rows == [rows]
    monkeypatch.setitem(deepgemm_rows._split, (256, 256), frozenset({deepgemm_rows.bucket(rows)}))
    halves = deepgemm_rows.gemm(library, a, a_scale, w, w_scale)
    assert library.rows[1:] == [128, rows - 128]
    assert torch.equal(halves, whole)
    other = deepgemm_rows.gemm(library, a[:64], a_scale[:64], w, w_scale)  # another bucket: whole
    assert library.rows[3:] == [64] and torch.equal(other, whole[:64])


def test_calibration_is_empty_wherever_deepgemm_does_not_take_the_layer():
    w, w_scale = _weight(256, 256)
    assert dsa_kernels.calibrate_fp8_linear(w, w_scale, 2048) == frozenset()  # CPU: the reference
    per_row = torch.ones(256, 2)
    assert dsa_kernels.calibrate_fp8_linear(w, per_row, 2048) == frozenset()


def test_buckets_read_as_row_ranges():
    assert deepgemm_rows.row_ranges(frozenset({11, 12, 15, 16, 30})) == "641-768, 897-1024, 1857-1920"


@pytest.mark.gpu
@pytest.mark.skipif(not DEEPGEMM, reason="DeepGEMM not installed")
def test_calibration_keeps_the_bits_of_the_whole_gemm(monkeypatch):
    # V3.2's shared expert, gate and up: one wave of large tiles from 704 to 1024 rows on the H200
    n, k = 4096, 7168
    w, w_scale = _weight(n, k, "cuda")
    monkeypatch.setattr(deepgemm_rows, "_split", {})
    split = dsa_kernels.calibrate_fp8_linear(w, w_scale, 1100)
    assert split <= set(range(2, deepgemm_rows.bucket(1100) + 1))
    library = dsa_kernels.dispatch._library("deep_gemm")
    x = torch.randn(1100, k, device="cuda", dtype=torch.bfloat16)
    for b in sorted(split) or [deepgemm_rows.bucket(1024)]:
        for rows in (b * deepgemm_rows.BUCKET - 17, b * deepgemm_rows.BUCKET):
            a, a_scale = dsa_kernels.quantize_act(x[:rows])
            want = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            library.fp8_gemm_nt((a, a_scale), (w, w_scale), want)
            assert torch.equal(dsa_kernels.fp8_linear_quantized(a, a_scale, w, w_scale), want)
    assert ("deepgemm", "fp8_gemm_nt", n, k) not in dsa_kernels.dispatch._REFUSED
    print(f"split buckets of [{n}, {k}]: {deepgemm_rows.row_ranges(split)}")

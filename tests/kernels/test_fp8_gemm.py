"""Block-scaled FP8 GEMMs (kernels/fp8_gemm.py) against their references (kernels/reference.py)."""

import pytest
import torch

import dsa_kernels
from dsa_backend.weights import quantize_fp8_block
from dsa_kernels import fp8_gemm, reference


def _weight(n: int, k: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    w, scale = quantize_fp8_block(torch.randn(n, k) * 0.05, (128, 128))
    return w.to(device), scale.to(device)


def _experts(groups: int, n: int, k: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    parts = [_weight(n, k, device) for _ in range(groups)]
    return torch.stack([w for w, _ in parts]), torch.stack([s for _, s in parts])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("m, k", [(1, 128), (5, 200), (19, 64), (40, 384), (0, 128)])
def test_activation_quantization_is_bit_exact(m, k):
    x = torch.randn(m, k) * 3
    x[:, :3] = 0.0  # a group's zeros and, for k <= 128, whole-zero groups below
    if m > 2:
        x[2] = 0.0
    values, scales = fp8_gemm.quantize_act(x)
    want_values, want_scales = reference.quantize_act_ref(x)
    assert torch.equal(_bits(values), _bits(want_values))
    assert torch.equal(scales, want_scales)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_silu_mul_quantize_is_the_activation_then_its_quantization(dtype, weighted):
    # 37 rows (not a multiple of the 16 a program), I = 300 (a ragged last group)
    g = torch.Generator().manual_seed(3)
    h = (torch.randn(37, 600, generator=g) * 3).to(dtype)
    row_weight = torch.rand(37, generator=g) * 2 if weighted else None
    q, s = fp8_gemm.silu_mul_quantize(h, row_weight)
    want_q, want_s = reference.silu_mul_quantize_ref(h, row_weight)
    assert q.shape == (37, 300) and s.shape == (37, 3)
    if dtype == torch.bfloat16:  # rounded to bf16 after each product, as torch does
        assert torch.equal(_bits(q), _bits(want_q)) and torch.equal(s, want_s)
    else:  # exp's last bit (numpy's against torch's) is not rounded away
        assert (_bits(q) != _bits(want_q)).float().mean() < 1e-3
        torch.testing.assert_close(s, want_s, rtol=1e-6, atol=0)
    gate, up = h.float().chunk(2, dim=-1)
    act = gate * torch.sigmoid(gate) * up * (1 if row_weight is None else row_weight[:, None])
    dequantized = q.float() * s.repeat_interleave(128, 1)[:, :300]
    assert ((dequantized - act).norm() / act.norm()) < 0.05  # e4m3's 3 mantissa bits


def test_a_negative_that_rounds_to_zero_is_negative_zero():
    # torch's cast gives -0 (0x80); the subnormal rounding by hand once lost the sign (found on the
    # H100: 11 of 3.7M activations of a [512, 7168] bf16 input)
    x = torch.tensor([[-1e-7, 1e-7, -4.4e-6, 1.0] + [0.0] * 124])  # v = x * 448: -0, +0, -2^-9
    values, _ = fp8_gemm.quantize_act(x)
    assert values.view(torch.uint8)[0, :3].tolist() == [0x80, 0x00, 0x81]
    assert torch.equal(_bits(values), _bits(reference.quantize_act_ref(x)[0]))


def test_activation_scales_cover_a_ragged_last_group():
    x = torch.randn(3, 200)
    _, scales = fp8_gemm.quantize_act(x)
    assert scales.shape == (3, 2)
    torch.testing.assert_close(scales[:, 1], x[:, 128:].abs().amax(1) / 448.0)


@pytest.mark.parametrize("m, n, k", [(1, 64, 128), (3, 130, 200), (33, 256, 256), (70, 96, 384)])
def test_linear_on_quantized_activations_matches_reference(m, n, k):
    a, a_scale = reference.quantize_act_ref(torch.randn(m, k))
    w, w_scale = _weight(n, k)
    got = fp8_gemm.fp8_gemm(a, a_scale, w, w_scale, torch.float32)
    torch.testing.assert_close(got, reference.fp8_linear_ref(a, a_scale, w, w_scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m, n, k", [(1, 64, 128), (3, 130, 200), (33, 256, 256)])
def test_linear_quantizes_its_input_first(m, n, k):
    x = torch.randn(m, k) * 3
    x[0, :100] = 0.0  # a group of zeros but its tail
    w, w_scale = _weight(n, k)
    got = fp8_gemm.fp8_linear(x, w, w_scale)
    assert got.dtype == x.dtype
    a, a_scale = reference.quantize_act_ref(x)
    assert torch.equal(got, fp8_gemm.fp8_gemm(a, a_scale, w, w_scale, torch.float32))


def test_a_narrow_linear_splits_k_and_sums_the_splits():
    # one output tile over 8 K blocks on the interpreter's 4 "SMs": two splits
    assert fp8_gemm._split_k(1, 8, 4) == 2
    x = torch.randn(2, 1024)
    w, w_scale = _weight(64, 1024)
    got = fp8_gemm.fp8_linear(x, w, w_scale)
    torch.testing.assert_close(got, reference.fp8_linear_ref(*reference.quantize_act_ref(x), w, w_scale),
                               rtol=1e-5, atol=1e-5)


def test_split_k_leaves_full_grids_alone_and_keeps_four_blocks_a_split():
    assert fp8_gemm._split_k(132, 56, 132) == 1
    assert fp8_gemm._split_k(12, 56, 132) == 14  # 7168 / 128 blocks over 14 splits: 4 each
    assert fp8_gemm._split_k(12, 4, 132) == 1


def test_linear_output_takes_the_inputs_dtype_or_the_requested_one():
    x = torch.randn(4, 128).bfloat16()
    w, w_scale = _weight(64, 128)
    assert fp8_gemm.fp8_linear(x, w, w_scale).dtype == torch.bfloat16
    a, a_scale = reference.quantize_act_ref(x)
    assert fp8_gemm.fp8_gemm(a, a_scale, w, w_scale).dtype == torch.bfloat16
    assert fp8_gemm.fp8_gemm(a, a_scale, w, w_scale, torch.float32).dtype == torch.float32


@pytest.mark.parametrize("ends", [[3, 3, 20], [0, 0, 1], [17, 40, 41], [0, 0, 0]])
def test_grouped_linear_matches_reference_with_empty_and_single_row_groups(ends):
    groups, n, k = len(ends), 130, 256
    w, w_scale = _experts(groups, n, k)
    a, a_scale = reference.quantize_act_ref(torch.randn(ends[-1], k))
    runs = torch.tensor(ends, dtype=torch.int32)
    got = fp8_gemm.fp8_grouped_linear(a, a_scale, w, w_scale, runs, torch.float32)
    assert got.shape == (ends[-1], n)
    torch.testing.assert_close(got, reference.fp8_grouped_linear_ref(a, a_scale, w, w_scale, runs),
                               rtol=1e-5, atol=1e-5)


def test_grouped_linear_takes_runs_that_start_on_a_multiple_of_align():
    # DeepGEMM's layout: each run starts at the previous end rounded up to 4 here (128 there);
    # runs of 3, 5, 0 and 6 rows, the empty one ending where it starts
    groups, n, k, align = 4, 130, 256, 4
    ends = torch.tensor([3, 9, 12, 18], dtype=torch.int32)
    assert fp8_gemm.run_starts(ends, align).tolist() == [0, 4, 12, 12]
    w, w_scale = _experts(groups, n, k)
    a, a_scale = reference.quantize_act_ref(torch.randn(20, k))
    got = fp8_gemm.fp8_grouped_linear(a, a_scale, w, w_scale, ends, torch.float32, align)
    want = reference.fp8_grouped_linear_ref(a, a_scale, w, w_scale, ends, align)
    in_runs = torch.tensor([r < 3 or 4 <= r < 9 or 12 <= r < 18 for r in range(20)])
    assert want[~in_runs].abs().sum() == 0 and want[in_runs].abs().min(dim=1).values.gt(0).all()
    torch.testing.assert_close(got[in_runs], want[in_runs], rtol=1e-5, atol=1e-5)
    # the same rows back to back give the same products
    packed = torch.tensor([3, 8, 8, 14], dtype=torch.int32)
    rows = in_runs.nonzero().flatten()
    torch.testing.assert_close(fp8_gemm.fp8_grouped_linear(a[rows], a_scale[rows], w, w_scale, packed, torch.float32),
                               want[in_runs], rtol=1e-5, atol=1e-5)


def test_experts_go_to_deepgemm_only_with_block_scales_and_enough_pairs():
    w, w_scale = _experts(2, 256, 256)
    per_row = w_scale.repeat_interleave(128, 1)
    many = dsa_kernels.dispatch.DEEPGEMM_GROUPED_PAIRS
    assert dsa_kernels.expert_alignment(many, (w, w_scale)) == 1  # on the CPU
    assert dsa_kernels.expert_alignment(many, (w, w_scale), (w, per_row)) == 1
    assert dsa_kernels.expert_alignment(many - 1, (w, None)) == 1


def test_grouped_linear_takes_per_row_scales():
    # stacked gate / up halves that do not end on a 128-row block carry one scale row per weight row
    groups, n, k = 2, 96, 128
    w, block_scale = _experts(groups, n, k)
    per_row = block_scale.repeat_interleave(128, 1)[:, :n] * torch.linspace(0.5, 1.5, n)[None, :, None]
    a, a_scale = reference.quantize_act_ref(torch.randn(9, k))
    runs = torch.tensor([4, 9], dtype=torch.int32)
    got = fp8_gemm.fp8_grouped_linear(a, a_scale, w, per_row, runs, torch.float32)
    want = reference.fp8_grouped_linear_ref(a, a_scale, w, per_row, runs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # and the per-row reference is the block one scaled row by row
    torch.testing.assert_close(reference.dequantize_weight_ref(w, per_row)[0, 5],
                               reference.dequantize_weight_ref(w, block_scale)[0, 5] * per_row[0, 5, 0]
                               / block_scale[0, 0, 0])


def test_reference_linear_is_the_dequantized_product():
    x = torch.randn(6, 256)
    w_full = torch.randn(64, 256) * 0.05
    w, w_scale = quantize_fp8_block(w_full, (128, 128))
    a, a_scale = reference.quantize_act_ref(x)
    got = reference.fp8_linear_ref(a, a_scale, w, w_scale)
    # e4m3 keeps 3 mantissa bits: each operand within 2^-4 relative, the sums of 256 much closer
    assert ((got - x @ w_full.T).norm() / (x @ w_full.T).norm()) < 0.05


def test_auto_gives_deepgemm_only_bf16_layers_of_64_rows_and_up_on_sm90():
    from dsa_kernels.dispatch import _deepgemm_fp8_linear

    assert _deepgemm_fp8_linear(64, torch.bfloat16, (9, 0))
    assert not _deepgemm_fp8_linear(63, torch.bfloat16, (9, 0))
    assert not _deepgemm_fp8_linear(512, torch.float32, (9, 0))
    assert not _deepgemm_fp8_linear(512, torch.bfloat16, (10, 0))  # UE8M0 scales there
    assert not _deepgemm_fp8_linear(512, torch.bfloat16, (8, 9))


def test_dispatch_runs_the_references_on_the_cpu():
    x = torch.randn(5, 256)
    w, w_scale = _weight(64, 256)
    a, a_scale = dsa_kernels.quantize_act(x)
    assert torch.equal(_bits(a), _bits(reference.quantize_act_ref(x)[0]))
    assert torch.equal(dsa_kernels.fp8_linear(x, w, w_scale), reference.fp8_linear_ref(a, a_scale, w, w_scale))


# ---------------------------------------------------------------- GPU, at DeepSeek-V3.2's shapes


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 32, 100, 512])
@pytest.mark.parametrize("n, k", [(1536, 7168), (576, 7168), (7168, 16384), (24576, 1536)])
@pytest.mark.parametrize("backend", ["triton", "auto"])
def test_linear_matches_reference_on_the_gpu(m, n, k, backend):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a, a_scale = fp8_gemm.quantize_act(x)
    want_a, want_scale = reference.quantize_act_ref(x.cpu())  # torch's GPU division by 448 is a product
    assert torch.equal(_bits(a).cpu(), _bits(want_a)) and torch.equal(a_scale.cpu(), want_scale)
    w, w_scale = _weight(n, k, "cuda")
    got = dsa_kernels.fp8_linear(x, w, w_scale, backend=backend).float()
    want = reference.fp8_linear_ref(a, a_scale, w, w_scale)
    assert ((got - want).norm() / want.norm()) < 5e-3  # bf16 output rounding, other summation order


@pytest.mark.gpu
@pytest.mark.parametrize("pairs", [8, 256, 2048])
def test_grouped_linear_matches_reference_on_the_gpu(pairs):
    groups, n, k = 16, 4096, 7168
    w, w_scale = _experts(groups, n, k, "cuda")
    experts = torch.randint(0, groups, (pairs,), device="cuda").sort().values
    runs = torch.searchsorted(experts, torch.arange(groups, device="cuda"), right=True).int()
    a, a_scale = fp8_gemm.quantize_act(torch.randn(pairs, k, device="cuda", dtype=torch.bfloat16))
    got = fp8_gemm.fp8_grouped_linear(a, a_scale, w, w_scale, runs).float()
    want = reference.fp8_grouped_linear_ref(a, a_scale, w, w_scale, runs)
    assert ((got - want).norm() / want.norm()) < 5e-3


@pytest.mark.gpu
@pytest.mark.skipif(not dsa_kernels.available_backends("cuda")["deepgemm"], reason="DeepGEMM not installed")
def test_deepgemm_takes_runs_laid_out_at_its_alignment_and_matches_ours():
    groups, n, k = 16, 4096, 7168
    w, w_scale = _experts(groups, n, k, "cuda")
    pairs = dsa_kernels.dispatch.DEEPGEMM_GROUPED_PAIRS
    align = dsa_kernels.expert_alignment(pairs, (w, w_scale))
    assert align == 128
    counts = torch.tensor([0, 1, 127, 128, 129] + [0] * 10 + [pairs - 385], device="cuda", dtype=torch.int32)
    padded = (counts + align - 1) // align * align
    ends = (padded.cumsum(0) - padded + counts).int()
    a, a_scale = fp8_gemm.quantize_act(torch.randn(int(padded.sum()) + align, k, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = dsa_kernels.fp8_grouped_linear(a, a_scale, w, w_scale, ends, align=align)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ("deepgemm", "m_grouped_fp8_gemm_nt_contiguous") not in dsa_kernels.dispatch._REFUSED
    ours = fp8_gemm.fp8_grouped_linear(a, a_scale, w, w_scale, ends, align=align)
    starts = fp8_gemm.run_starts(ends, align)
    in_runs = torch.cat([torch.arange(int(s), int(e)) for s, e in zip(starts, ends)]).cuda()
    got, ours = got[in_runs].float(), ours[in_runs].float()
    assert ((got - ours).norm() / ours.norm()) < 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 256, 5000])
def test_silu_mul_quantize_matches_reference_on_the_gpu(rows):
    h = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16) * 3
    row_weight = torch.rand(rows, device="cuda")
    q, s = fp8_gemm.silu_mul_quantize(h, row_weight)
    want_q, want_s = reference.silu_mul_quantize_ref(h.cpu(), row_weight.cpu())
    # the GPU's exp may differ from the CPU's in the last bit, which bf16 rounding mostly hides
    assert (_bits(q).cpu() != _bits(want_q)).float().mean() < 1e-3
    torch.testing.assert_close(s.cpu(), want_s, rtol=1e-2, atol=0)


@pytest.mark.gpu
def test_grouped_linear_reads_nothing_back_and_replays_in_a_graph():
    groups, n, k = 16, 512, 1024
    w, w_scale = _experts(groups, n, k, "cuda")
    a, a_scale = fp8_gemm.quantize_act(torch.randn(64, k, device="cuda", dtype=torch.bfloat16))
    runs = torch.tensor([4 * (g + 1) for g in range(groups)], dtype=torch.int32, device="cuda")
    fp8_gemm.fp8_grouped_linear(a, a_scale, w, w_scale, runs)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_gemm.fp8_grouped_linear(a, a_scale, w, w_scale, runs)
    runs.copy_(torch.tensor([0] * (groups - 1) + [64], dtype=torch.int32))  # every row to the last expert
    graph.replay()
    want = reference.fp8_grouped_linear_ref(a, a_scale, w, w_scale, runs)
    assert ((out.float() - want).norm() / want.norm()) < 5e-3

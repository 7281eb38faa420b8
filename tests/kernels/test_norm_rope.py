"""RMSNorm and RoPE in one kernel each (kernels/norm_rope.py) against their references: RoPE bit
for bit, RMSNorm within one bf16 step (its sum of squares runs in another order)."""

import pytest
import torch

import dsa_kernels
from dsa_kernels import norm_rope, reference


@pytest.mark.parametrize("n", [128, 512, 1536, 7168])
def test_rms_norm_is_within_one_bf16_step_of_the_reference_and_mostly_exact(n):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(7, n + 64, generator=g) * 3).to(torch.bfloat16)[:, 64:]  # rows with a stride past n
    weight = (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)
    got = norm_rope.rms_norm(x, weight, 1e-6)
    want = reference.rms_norm_ref(x, weight, 1e-6)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    step = want.float().abs() * 2**-7 + 1e-30  # one bf16 ulp (8 significant bits) of each value
    assert ((got.float() - want.float()).abs() <= step).all()
    assert (got == want).float().mean() > 0.97


def test_rms_norm_of_three_dim_input_and_of_no_rows():
    x = torch.randn(3, 4, 256).to(torch.bfloat16)
    w = torch.ones(256, dtype=torch.bfloat16)
    got = norm_rope.rms_norm(x, w, 1e-5)
    assert got.shape == (3, 4, 256)
    assert torch.allclose(got.float(), reference.rms_norm_ref(x, w, 1e-5).float(), rtol=1e-2)
    assert norm_rope.rms_norm(x[:0], w, 1e-5).shape == (0, 4, 256)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("shape, rotary_dim", [((5, 20, 64), None), ((3, 64), None), ((4, 8, 128), 64),
                                               ((2, 128), 64), ((0, 4, 64), None)])
def test_rope_equals_the_reference_bit_for_bit(interleaved, shape, rotary_dim):
    g = torch.Generator().manual_seed(sum(shape))
    t, r = shape[0], rotary_dim or shape[-1]
    # a strided view, as the layers hand over (q's rope part is the tail of each head's row)
    wide = (torch.randn(*shape[:-1], shape[-1] + 32, generator=g) * 4).to(torch.bfloat16)
    x = wide[..., 32:]
    angles = torch.arange(t, dtype=torch.float32)[:, None] * torch.rand(r // 2, generator=g)
    cos, sin = angles.cos() * 1.3, angles.sin() * 1.3  # an attention factor, as YaRN folds in
    got = norm_rope.rope(x, cos, sin, interleaved, rotary_dim)
    want = reference.rope_ref(x, cos, sin, interleaved, rotary_dim)
    assert got.shape == x.shape and got.is_contiguous()
    assert torch.equal(got, want)


@pytest.mark.parametrize("heads", [16, 20])
def test_rope_behind_a_prefix_is_the_absorbed_query_bit_for_bit(heads):
    # MLA's [q_latent | rope(q_rope)]: the latent part a head-major GEMM's output seen token-major
    g = torch.Generator().manual_seed(heads)
    t = 3
    latent = torch.randn(heads, t, 64, generator=g).to(torch.bfloat16).transpose(0, 1)
    x = (torch.randn(t, heads, 48, generator=g) * 4).to(torch.bfloat16)[..., 16:]
    angles = torch.arange(t, dtype=torch.float32)[:, None] * torch.rand(16, generator=g)
    cos, sin = angles.cos(), angles.sin()
    got = norm_rope.rope(x, cos, sin, True, prefix=latent)
    assert got.shape == (t, heads, 96) and got.is_contiguous()
    assert torch.equal(got, torch.cat([latent, reference.rope_ref(x, cos, sin, True)], dim=-1))
    assert torch.equal(dsa_kernels.rope(x, cos, sin, True, prefix=latent), got)  # the reference off the GPU


def test_dispatch_runs_the_reference_off_the_gpu_and_for_other_dtypes():
    x = torch.randn(4, 2, 64)
    cos, sin = torch.rand(4, 32), torch.rand(4, 32)
    assert torch.equal(dsa_kernels.rope(x, cos, sin, True), reference.rope_ref(x, cos, sin, True))
    w = torch.rand(64)
    assert torch.equal(dsa_kernels.rms_norm(x, w, 1e-6), reference.rms_norm_ref(x, w, 1e-6))
    # asked for by name, ours runs (bf16 only; under the interpreter here)
    xb = x.to(torch.bfloat16)
    assert torch.equal(dsa_kernels.rope(xb, cos, sin, False, backend="triton"), reference.rope_ref(xb, cos, sin, False))


@pytest.mark.gpu
def test_compiled_kernels_match_the_references_at_the_models_shapes():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(33, 7168 + 512, device="cuda", generator=g).to(torch.bfloat16)[:, 512:]
    w = (1 + 0.1 * torch.randn(7168, device="cuda", generator=g)).to(torch.bfloat16)
    got, want = dsa_kernels.rms_norm(x, w, 1e-6), reference.rms_norm_ref(x, w, 1e-6)
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30).all()
    q = torch.randn(33, 128, 192, device="cuda", generator=g).to(torch.bfloat16)[..., 128:]  # MLA q's rope part
    k = torch.randn(33, 64, 128, device="cuda", generator=g).to(torch.bfloat16)  # indexer q, rope on 64 of 128
    angles = torch.arange(33, device="cuda")[:, None] * torch.rand(32, device="cuda", generator=g)
    cos, sin = angles.cos(), angles.sin()
    for interleaved in (True, False):
        assert torch.equal(dsa_kernels.rope(q, cos, sin, interleaved), reference.rope_ref(q, cos, sin, interleaved))
        assert torch.equal(dsa_kernels.rope(k, cos, sin, interleaved, rotary_dim=64),
                           reference.rope_ref(k, cos, sin, interleaved, rotary_dim=64))
    latent = torch.randn(128, 33, 512, device="cuda", generator=g).to(torch.bfloat16).transpose(0, 1)
    assert torch.equal(dsa_kernels.rope(q, cos, sin, True, prefix=latent),
                       torch.cat([latent, reference.rope_ref(q, cos, sin, True)], dim=-1))
